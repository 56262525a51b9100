/**
 * TLS and mutual TLS from the server settings, with a throwaway CA made by openssl:
 * a client with a certificate the CA signed streams; one without is refused.
 */
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Runner } from "../../../src/gen/runner/v1/runner_pb.js";
import { createRunnerService, startRunnerServer, type RunnerServer } from "../../../src/runner/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { end, line, send } from "../../fixtures/runner-service.js";

const dir = mkdtempSync(join(tmpdir(), "runner-depot-tls-"));
const file = (name: string) => join(dir, name);
function openssl(...args: string[]) {
  execFileSync("openssl", args, { cwd: dir, stdio: "pipe" });
}

function makePki() {
  openssl(
    "req",
    "-x509",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-days",
    "1",
    "-subj",
    "/CN=test-ca",
    "-keyout",
    "ca.key",
    "-out",
    "ca.crt",
  );
  writeFileSync(file("server.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
  writeFileSync(file("client.ext"), "extendedKeyUsage=clientAuth\n");
  for (const [name, cn] of [
    ["server", "127.0.0.1"],
    ["client", "runner-vm"],
  ] as const) {
    openssl(
      "req",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-subj",
      `/CN=${cn}`,
      "-keyout",
      `${name}.key`,
      "-out",
      `${name}.csr`,
    );
    openssl(
      "x509",
      "-req",
      "-in",
      `${name}.csr`,
      "-CA",
      "ca.crt",
      "-CAkey",
      "ca.key",
      "-CAcreateserial",
      "-days",
      "1",
      "-extfile",
      `${name}.ext`,
      "-out",
      `${name}.crt`,
    );
  }
  const read = (name: string) => readFileSync(file(name));
  return {
    ca: read("ca.crt"),
    serverCert: read("server.crt"),
    serverKey: read("server.key"),
    clientCert: read("client.crt"),
    clientKey: read("client.key"),
  };
}

describe("runner server over TLS", () => {
  let pki: ReturnType<typeof makePki>;
  beforeAll(() => {
    pki = makePki();
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("plain TLS: a client trusting the CA streams over https", async () => {
    const queue = createMemoryQueue();
    const runner = createRunnerService(queue);
    const server = await startRunnerServer(runner, { port: 0, tls: { cert: pki.serverCert, key: pki.serverKey } });
    try {
      expect(server.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
      const client = createClient(Runner, createGrpcTransport({ baseUrl: server.url, nodeOptions: { ca: pki.ca } }));
      const id = randomUUID();
      expect(await send(client, [line(id, "secure"), end(id)])).toMatchObject({ ok: true, committed: "2" });
      expect((await runner.logs.read(id)).map((l) => l.line)).toEqual(["secure"]);
    } finally {
      await server.close();
      await runner.close();
    }
  });

  it("mutual TLS does not lift the loopback-only rule of a service with neither secret nor authorize hook", async () => {
    const open = createRunnerService(createMemoryQueue());
    const tls = { cert: pki.serverCert, key: pki.serverKey, ca: pki.ca };
    // Refused before anything is bound (no non-loopback socket is ever opened here).
    await expect(startRunnerServer(open, { host: "0.0.0.0", port: 0, tls })).rejects.toThrow(
      /refusing to listen on 0\.0\.0\.0.*mutual TLS alone/,
    );
    await expect(
      startRunnerServer(open, { host: "192.0.2.10", port: 0, tls: { ...tls, requestCert: true } }),
    ).rejects.toThrow(/refusing to listen/);
    // On loopback the same settings listen.
    const server = await startRunnerServer(open, { host: "127.0.0.1", port: 0, tls });
    try {
      const client = createClient(
        Runner,
        createGrpcTransport({
          baseUrl: server.url,
          nodeOptions: { ca: pki.ca, cert: pki.clientCert, key: pki.clientKey },
        }),
      );
      const id = randomUUID();
      expect(await send(client, [line(id, "on loopback"), end(id)])).toMatchObject({ ok: true, committed: "2" });
    } finally {
      await server.close();
      await open.close();
    }
  });

  describe("mutual TLS", () => {
    let server: RunnerServer;
    const runner = createRunnerService(createMemoryQueue());
    beforeAll(async () => {
      server = await startRunnerServer(runner, {
        port: 0,
        tls: { cert: pki.serverCert, key: pki.serverKey, ca: pki.ca },
      });
    });
    afterAll(async () => {
      await server.close();
      await runner.close();
    });

    it("a client with a certificate the CA signed connects and streams", async () => {
      const client = createClient(
        Runner,
        createGrpcTransport({
          baseUrl: server.url,
          nodeOptions: { ca: pki.ca, cert: pki.clientCert, key: pki.clientKey },
        }),
      );
      const id = randomUUID();
      expect(await send(client, [line(id, "hello"), end(id)])).toMatchObject({ ok: true, committed: "2" });
    });

    it("a client without a certificate is refused and stores nothing", async () => {
      const client = createClient(Runner, createGrpcTransport({ baseUrl: server.url, nodeOptions: { ca: pki.ca } }));
      const id = randomUUID();
      const out = await send(client, [line(id, "intruder")]);
      expect(out.ok).toBeNull();
      expect(out.code).not.toBeNull();
      expect(await runner.logs.get(id)).toBeNull();
    });

    it("a client with a certificate from another CA is refused", async () => {
      openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=rogue",
        "-keyout",
        "rogue.key",
        "-out",
        "rogue.crt",
      );
      const client = createClient(
        Runner,
        createGrpcTransport({
          baseUrl: server.url,
          nodeOptions: { ca: pki.ca, cert: readFileSync(file("rogue.crt")), key: readFileSync(file("rogue.key")) },
        }),
      );
      const id = randomUUID();
      expect((await send(client, [line(id, "rogue")])).ok).toBeNull();
      expect(await runner.logs.get(id)).toBeNull();
    });
  });
});
