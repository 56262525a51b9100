/**
 * "fetch failed" turned into the cause, against real sockets: a closed port (refused), a
 * name that cannot resolve (DNS), TLS to a plain-HTTP port and to a self-signed server,
 * and a server that never answers (timeout).
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import { createServer as createTlsServer } from "node:https";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createDepotClient } from "../src/depot/client/depot-client.js";
import { fetchFailureCause } from "../src/fetch-failure.js";

const silent = createServer(() => {
  // Never answers: the timeout case.
});
let silentUrl: string;
const dir = mkdtempSync(path.join(os.tmpdir(), "fetch-failure-"));
let tls: ReturnType<typeof createTlsServer>;
let tlsUrl: string;

beforeAll(async () => {
  await new Promise<void>((r) => silent.listen(0, "127.0.0.1", r));
  silentUrl = `http://127.0.0.1:${(silent.address() as AddressInfo).port}`;
  execFileSync(
    "openssl",
    [
      "req",
      "-x509",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-days",
      "1",
      "-subj",
      "/CN=127.0.0.1",
      "-keyout",
      "k.pem",
      "-out",
      "c.pem",
    ],
    { cwd: dir, stdio: "pipe" },
  );
  tls = createTlsServer(
    { key: readFileSync(path.join(dir, "k.pem")), cert: readFileSync(path.join(dir, "c.pem")) },
    (_q, r) => r.end("hi"),
  );
  await new Promise<void>((r) => tls.listen(0, "127.0.0.1", r));
  tlsUrl = `https://127.0.0.1:${(tls.address() as AddressInfo).port}`;
});
afterAll(async () => {
  silent.closeAllConnections();
  await new Promise((r) => silent.close(r));
  await new Promise((r) => tls.close(r));
  rmSync(dir, { recursive: true, force: true });
});

async function causeOf(url: string, init?: RequestInit): Promise<string> {
  const error = await fetch(url, init).then(
    () => null,
    (e: unknown) => e,
  );
  expect(error).not.toBeNull();
  return fetchFailureCause(error);
}

async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

describe("fetchFailureCause", () => {
  it("refused", async () => {
    expect(await causeOf(`http://127.0.0.1:${await closedPort()}/`)).toBe(
      "connection refused (ECONNREFUSED): nothing listens there",
    );
  });

  it("DNS", async () => {
    // .invalid never resolves (RFC 6761); offline resolvers say EAI_AGAIN instead of ENOTFOUND.
    expect(await causeOf("http://no-such-host.invalid/")).toMatch(
      /^DNS lookup failed \((ENOTFOUND|EAI_AGAIN)\): no such host$/,
    );
  });

  it("TLS against a plain-HTTP port, and a certificate nobody vouches for", async () => {
    expect(await causeOf(`${silentUrl.replace("http:", "https:")}/`)).toBe(
      "TLS failed (ERR_SSL_WRONG_VERSION_NUMBER): the server does not speak TLS there (http:// rather than https://?)",
    );
    // Node 24 appends a hint (--use-system-ca) to the certificate message; Node 22 does not.
    expect(await causeOf(`${tlsUrl}/`)).toMatch(
      /^TLS failed \(DEPTH_ZERO_SELF_SIGNED_CERT\): self-signed certificate($|; )/,
    );
  });

  it("timeout", async () => {
    expect(await causeOf(`${silentUrl}/`, { signal: AbortSignal.timeout(200) })).toBe("timed out");
  });

  it("the depot client names the URL it could not reach", async () => {
    const port = await closedPort();
    await expect(createDepotClient({ baseUrl: `http://127.0.0.1:${port}` }).catalog()).rejects.toMatchObject({
      code: "UNAVAILABLE",
      message: `cannot reach http://127.0.0.1:${port}/catalog: connection refused (ECONNREFUSED): nothing listens there`,
    });
  });
});
