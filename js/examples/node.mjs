// A converger client in Node: the last 10 messages of a conversation, one
// message sent, and its own copy received, then a clean stop.
// Usage: TOKEN=... [CONVERGER_URL=ws://127.0.0.1:8080/v1/ws] [CONV=room1] node example.mjs
import WebSocket from "ws"; // Node 22 has a global WebSocket: then leave this out
import { Client } from "converger-client";

const client = new Client({
  urls: [process.env.CONVERGER_URL ?? "ws://127.0.0.1:8080/v1/ws"],
  token: process.env.TOKEN,
  WebSocket,
});
const room = client.subscribe(process.env.CONV ?? "room1", { history: 10 });
let mine = null;
room.on("message", async (m) => {
  console.log(`#${m.seq} ${m.sender}: ${JSON.stringify(m.body)}`);
  if (m.seq === (await mine)?.seq) await client.stop();
});
room.on("synced", () => (mine ??= client.send(room.conv, { text: "hello from Node" })));
room.on("unsubscribed", (why) => {
  console.error(`refused: ${why}`); // forbidden, not_found, channel_inactive
  process.exitCode = 1;
  client.stop();
});
client.on("state", (s) => console.error(`[${s.state}] ${s.node ?? s.reason ?? ""}`));
client.start();
