// The package as a user gets it: `npm pack` makes the tarball, an empty
// project installs it (with ws, for Node 20), and the example in
// js/examples/node.mjs (the README's Node example) runs against a real
// node; the type declarations ship and type-check a TypeScript caller;
// the README's two examples are the files this and browser.test.mjs run.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ROOT, mintToken, startNode } from "./support.mjs";

const JS = join(ROOT, "js");
const work = mkdtempSync(join(tmpdir(), "converger-js-install-"));
let node;
after(async () => {
  await node?.finish();
  rmSync(work, { recursive: true, force: true });
});

function run(cmd, args, opts = {}) {
  return execFileSync(cmd, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 180000, ...opts });
}

test("npm pack, npm install into an empty project, and the Node example against a real node", async () => {
  // --ignore-scripts: dist/ is built already (scripts/js-build), and a
  // rebuild here would race the other tests that import it
  const out = JSON.parse(run("npm", ["pack", "--json", "--ignore-scripts", "--pack-destination", work], { cwd: JS }));
  const files = out[0].files.map((f) => f.path).sort();
  for (const f of ["dist/index.js", "dist/index.d.ts", "dist/client.js", "dist/core.d.ts", "README.md", "package.json", "examples/node.mjs"])
    assert.ok(files.includes(f), `${f} in the tarball (${files.join(", ")})`);
  assert.ok(!files.some((f) => f.startsWith("src/") || f.startsWith("test/") || f.startsWith("node_modules/")), files.join(", "));
  const tarball = join(work, out[0].filename);

  const app = join(work, "app");
  run("mkdir", ["-p", app]);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  const ws = JSON.parse(readFileSync(join(JS, "package-lock.json"), "utf8")).packages["node_modules/ws"].version;
  run("npm", ["install", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error", tarball, `ws@${ws}`], { cwd: app });
  copyFileSync(join(JS, "examples/node.mjs"), join(app, "example.mjs"));

  node = await startNode();
  const conv = await node.newConv();
  await node.must("POST", `/v1/conversations/${conv}/messages`, { sender: "server", body: { text: "before" } });
  const child = spawn("node", ["example.mjs"], {
    cwd: app,
    env: { ...process.env, CONVERGER_URL: node.wsUrl, CONV: conv, TOKEN: mintToken("alice", [conv]) },
  });
  let stdout = "", stderr = "";
  child.stdout.on("data", (d) => (stdout += d));
  child.stderr.on("data", (d) => (stderr += d));
  const timer = setTimeout(() => child.kill("SIGKILL"), 20000);
  const code = await new Promise((r) => child.on("exit", (c) => r(c)));
  clearTimeout(timer);
  assert.equal(code, 0, `exit ${code}\n${stdout}\n${stderr}`);
  assert.deepEqual(stdout.trim().split("\n"), ['#1 server: {"text":"before"}', '#2 alice: {"text":"hello from Node"}']);
  assert.match(stderr, /\[connected\] test:/);
  assert.match(stderr, /\[stopped\]/);

  // the declarations type-check a TypeScript caller
  writeFileSync(join(app, "check.ts"), `
import { Client, MemoryStorage, type Message, type Stats } from "converger-client";
const c = new Client({ urls: ["ws://127.0.0.1:8080/v1/ws"], getToken: async () => "t", storage: new MemoryStorage(), backoff: "full" });
const sub = c.subscribe("room1", { watermark: 0, presenceEvents: "users" });
sub.on("message", (m: Message) => m.seq + 1);
sub.on("synced", (head: number) => head);
const s: Stats = c.stats();
const p: Promise<{ seq: number; id: string }> = c.send("room1", { text: "hi" });
void s; void p;
`);
  const tsc = join(JS, "node_modules/typescript/bin/tsc");
  run("node", [tsc, "--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022", "--lib", "es2022,dom", "check.ts"], { cwd: app });
});

test("the README's examples are js/examples/node.mjs and web/example.html, as they are", () => {
  const readme = readFileSync(join(ROOT, "README.md"), "utf8");
  const blocks = [...readme.matchAll(/```(?:js|html)\n([\s\S]*?)```/g)].map((m) => m[1]);
  for (const file of ["js/examples/node.mjs", "web/example.html"]) {
    const text = readFileSync(join(ROOT, file), "utf8");
    assert.ok(blocks.includes(text), `README.md has ${file} as a code block, word for word`);
  }
});
