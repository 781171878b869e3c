/**
 * Where the client keeps what a restart of the application needs: the
 * clientId, every watermark with its epoch, and the sends not yet
 * acknowledged (core.ts's Snapshot), as one JSON value under one key.
 *
 * Any object with the Web Storage methods will do: `localStorage` and
 * `sessionStorage` in a browser, AsyncStorage-like wrappers elsewhere (with
 * synchronous reads), or MemoryStorage, the default, which keeps nothing
 * across a restart of the process.
 */
export interface StorageLike {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

/** A Storage in memory: the default; it lasts as long as the object. */
export class MemoryStorage implements StorageLike {
  private readonly items = new Map<string, string>();

  getItem(key: string): string | null {
    return this.items.has(key) ? this.items.get(key)! : null;
  }

  setItem(key: string, value: string): void {
    this.items.set(key, String(value));
  }

  removeItem(key: string): void {
    this.items.delete(key);
  }
}

/**
 * The browser's `localStorage` (kind "local", kept across reloads and
 * shared by the tabs of one origin) or `sessionStorage` ("session", kept
 * across reloads of one tab). Tabs that share a localStorage need a
 * `storageKey` each, or they resume each other's watermarks and sends.
 *
 * @throws TypeError where there is no such storage (Node, a sandboxed frame)
 */
export function browserStorage(kind: "local" | "session" = "local"): StorageLike {
  const g = globalThis as unknown as { localStorage?: StorageLike; sessionStorage?: StorageLike };
  let s: StorageLike | undefined;
  try {
    s = kind === "local" ? g.localStorage : g.sessionStorage;
  } catch {
    s = undefined; // a frame that may not use storage throws on access
  }
  if (!s) throw new TypeError(`no ${kind}Storage here: use MemoryStorage or your own StorageLike`);
  return s;
}
