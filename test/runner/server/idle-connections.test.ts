/**
 * Idle connections (issue 31, item 10): a client that answers pings but opens no stream
 * used to be kept for ever (a descriptor and 5–18 KiB each); startRunnerServer closes a
 * connection with no open stream for `idleConnectionMs`, never one with a call open.
 */
import * as http2 from "node:http2";
import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { describe, expect, it } from "vitest";
import { createRunnerService, mintJobToken, startRunnerServer } from "../../../src/runner/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { line, until } from "../../fixtures/runner-service.js";
import { connect, frame, openCall } from "../../fixtures/runner-raw-calls.js";

const SECRET = "idle-connections-secret-0123456789ab";

describe("runner server: idle connections are closed (issue 31, item 10)", () => {
  it("a connection answering pings with no stream gets GOAWAY after idleConnectionMs; one with a call open is kept", async () => {
    const runner = createRunnerService(createMemoryQueue(), { secret: SECRET });
    const server = await startRunnerServer(runner, { port: 0, keepAliveMs: 50, idleConnectionMs: 400 });
    const idle = connect(server.url);
    const idleSettings = new Promise<void>((resolve) => idle.once("remoteSettings", () => resolve()));
    const busy = connect(server.url);
    try {
      let pings = 0;
      idle.on("ping", () => pings++);
      let goaway: number | null = null;
      idle.on("goaway", (code) => (goaway = code));
      let idleClosed = false;
      idle.on("close", () => (idleClosed = true));
      let busyClosed = false;
      busy.on("close", () => (busyClosed = true));
      // The busy connection keeps one authenticated call open (the call's own idle limit is 60 s).
      const id = randomUUID();
      const call = openCall(busy, "grpc", mintJobToken(SECRET, id));
      call.stream.write(frame(line(id, "open")));
      await until(async () => (await runner.logs.get(id))?.committed === 1, "the call's first line stored");
      await idleSettings;
      // Before: answered pings kept it open for ever (the wait is the test's bound).
      for (let i = 0; i < 200 && !idleClosed; i++) await sleep(50);
      expect(pings).toBeGreaterThan(0);
      expect(goaway).toBe(http2.constants.NGHTTP2_NO_ERROR);
      expect(idleClosed).toBe(true);
      expect(busyClosed).toBe(false);
      call.stream.end();
      await call.status;
      // Idle now, the busy one goes the same way.
      await until(() => busyClosed, "the busy connection closed once idle");
    } finally {
      idle.destroy();
      busy.destroy();
      await server.close();
      await runner.close();
    }
  }, 30_000);
});
