// The Node `ws` peer of `converger bench peers`: sockets on /sub are the
// subscribers; every message a socket on /pub sends is sent to each of
// them (the broadcast loop of ws's own documentation). Usage: node ws.mjs
// PORT. It prints "listening PORT" once it accepts connections.
import { WebSocketServer } from "ws";

const port = Number(process.argv[2]);
if (!Number.isInteger(port) || port <= 0 || port > 65535) {
  console.error("usage: node ws.mjs PORT");
  process.exit(2);
}

const subs = new Set();
const wss = new WebSocketServer({
  host: "127.0.0.1",
  port,
  perMessageDeflate: false,
  maxPayload: 1 << 20,
  clientTracking: false,
});
wss.on("connection", (sock, req) => {
  if (req.url === "/pub") {
    sock.on("message", (data, isBinary) => {
      for (const s of subs) s.send(data, { binary: isBinary });
    });
  } else {
    subs.add(sock);
    sock.on("close", () => subs.delete(sock));
  }
  sock.on("error", () => {});
});
wss.on("listening", () => console.log(`listening ${port}`));
wss.on("error", (e) => {
  console.error(`ws.mjs: ${e.message}`);
  process.exit(1);
});
