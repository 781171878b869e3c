// The uWebSockets.js peer of `converger bench peers`: a socket that opens
// /sub is subscribed to topic "t"; every message a socket on /pub sends is
// published to "t", as it is (text or binary). Usage: node uws.mjs PORT.
// It prints "listening PORT" once it accepts connections.
//
// The package ships upstream uWS v20.30.0 binaries; its own entry point
// silently falls back to a JavaScript implementation when the binary does
// not load, which would measure something else. So the binary for this
// Node is loaded by its path, and anything else fails loudly.
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(import.meta.url);
const pkg = path.dirname(require.resolve("@trufflesuite/uws-js-unofficial/package.json"));
const binary = path.join(
  pkg,
  "binaries",
  `uws_${process.platform}_${process.arch}_${process.versions.modules}.node`,
);
let uws;
try {
  uws = require(binary);
} catch (e) {
  console.error(`uws.mjs: cannot load ${binary}: ${e.message}`);
  process.exit(2);
}

const port = Number(process.argv[2]);
if (!Number.isInteger(port) || port <= 0 || port > 65535) {
  console.error("usage: node uws.mjs PORT");
  process.exit(2);
}

const app = uws.App();
app.ws("/*", {
  compression: uws.DISABLED,
  maxPayloadLength: 1 << 20,
  maxBackpressure: 64 << 20,
  idleTimeout: 0,
  upgrade: (res, req, context) => {
    const role = req.getUrl() === "/pub" ? "pub" : "sub";
    res.upgrade(
      { role },
      req.getHeader("sec-websocket-key"),
      req.getHeader("sec-websocket-protocol"),
      req.getHeader("sec-websocket-extensions"),
      context,
    );
  },
  open: (ws) => {
    if (ws.getUserData().role === "sub") ws.subscribe("t");
  },
  message: (ws, message, isBinary) => {
    if (ws.getUserData().role === "pub") app.publish("t", message, isBinary);
  },
});
app.listen("127.0.0.1", port, (token) => {
  if (!token) {
    console.error(`uws.mjs: cannot listen on 127.0.0.1:${port}`);
    process.exit(1);
  }
  console.log(`listening ${port}`);
});
