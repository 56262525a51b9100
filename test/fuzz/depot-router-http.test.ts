/**
 * The depot router fuzz through real sockets (issue 9, fuzzing): what servePackageRouter
 * serves is the Node handler (depot/server/node-handler.ts: its own request conversion, native upload
 * bodies into the fs store) behind Node's HTTP parser and the connection bounds
 * (depot/server/connection-limits.ts), none of which the in-process target (depot/server/router.test.ts)
 * reaches. Each case is one raw HTTP/1.1 request on its own TCP connection: any method
 * token (CONNECT, TRACE, lower case, unknown), request targets in origin, absolute and
 * asterisk form, the depot's headers, raw header junk, and bodies framed by
 * Content-Length or chunked. Every answer: one complete response before the connection
 * closes, never a 5xx, every error `application/problem+json` with a code openapi.yaml
 * documents and the response's status.
 */
import { connect } from "node:net";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../src/adapters/fs/index.js";
import { createMemoryStore } from "../../src/adapters/memory/store.js";
import { bearerTokens } from "../../src/depot/server/auth.js";
import { createPackageRouter } from "../../src/depot/server/router.js";
import { servePackageRouter, type PackageServer } from "../../src/depot/server/serve.js";
import { silentLogger, type Logger } from "../../src/telemetry.js";
import { tempDir } from "../fixtures/depot.js";
import {
  authArb,
  DOCUMENTED_CODES,
  headerNameArb,
  headerValueArb,
  pathArb,
  queryArb,
  seedDepot,
  TOKEN,
} from "./depot-router-inputs.js";
import { fuzzParams, fuzzTimeout } from "./settings.js";

/** One parsed HTTP response. */
interface RawResponse {
  status: number;
  headers: Map<string, string>;
  body: Buffer;
}

/** Longest a case may wait for its answer: far above the server's deadlines below. */
const ANSWER_MS = 10_000;

/**
 * Sends `request` on a new connection and parses the first final response (1xx skipped;
 * body by Content-Length, chunked, or none for HEAD/204/304). Rejects when the connection
 * closes, or ANSWER_MS passes, before a whole response arrived.
 */
function exchange(port: number, request: Buffer, head: boolean): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    let data = Buffer.alloc(0);
    const socket = connect(port, "127.0.0.1", () => socket.write(request));
    const timer = setTimeout(() => finish(new Error(`no answer within ${ANSWER_MS} ms`)), ANSWER_MS);
    function finish(outcome: RawResponse | Error) {
      clearTimeout(timer);
      socket.destroy();
      if (outcome instanceof Error) reject(outcome);
      else resolve(outcome);
    }
    socket.on("data", (chunk) => {
      data = Buffer.concat([data, chunk]);
      for (;;) {
        const parsed = parseResponse(data, head);
        if (parsed === null) return;
        if (parsed.response.status >= 200) return finish(parsed.response);
        data = data.subarray(parsed.used);
      }
    });
    socket.on("error", () => undefined);
    socket.on("close", () =>
      finish(
        new Error(
          `connection closed before a whole response: ${JSON.stringify(data.toString("latin1").slice(0, 300))}`,
        ),
      ),
    );
  });
}

/** One response at the start of `data`, or null when more bytes are needed. */
function parseResponse(data: Buffer, head: boolean): { response: RawResponse; used: number } | null {
  const end = data.indexOf("\r\n\r\n");
  if (end < 0) return null;
  const lines = data.subarray(0, end).toString("latin1").split("\r\n");
  const status = Number(/^HTTP\/1\.1 (\d{3}) /.exec(lines[0]!)?.[1]);
  if (!Number.isInteger(status)) throw new Error(`not a status line: ${JSON.stringify(lines[0])}`);
  const headers = new Map<string, string>();
  for (const line of lines.slice(1)) {
    const colon = line.indexOf(":");
    headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
  }
  let at = end + 4;
  if (status < 200 || head || status === 204 || status === 304)
    return { response: { status, headers, body: Buffer.alloc(0) }, used: at };
  if (headers.get("transfer-encoding")?.toLowerCase() === "chunked") {
    const parts: Buffer[] = [];
    for (;;) {
      const lineEnd = data.indexOf("\r\n", at);
      if (lineEnd < 0) return null;
      const size = parseInt(data.subarray(at, lineEnd).toString("latin1"), 16);
      if (data.length < lineEnd + 2 + size + 2) return null;
      if (size === 0) {
        // Trailers are not sent by the depot: the last chunk's CRLF ends the body.
        return { response: { status, headers, body: Buffer.concat(parts) }, used: lineEnd + 4 };
      }
      parts.push(data.subarray(lineEnd + 2, lineEnd + 2 + size));
      at = lineEnd + 2 + size + 2;
    }
  }
  const length = Number(headers.get("content-length") ?? 0);
  if (data.length < at + length) return null;
  return { response: { status, headers, body: data.subarray(at, at + length) }, used: at + length };
}

/** Methods Node's parser knows (the router sees them), and tokens it refuses. */
const METHODS = [
  "GET",
  "HEAD",
  "POST",
  "PUT",
  "PATCH",
  "DELETE",
  "OPTIONS",
  "PROPFIND",
  "TRACE",
  "CONNECT",
  "QUERY",
  "SEARCH",
  "M-SEARCH",
  "PURGE",
];
const ODD_METHODS = ["TRACK", "get", "post", "FOO", "X"];
const TARGET_FORMS = ["origin", "origin", "origin", "absolute", "asterisk", "double-slash"] as const;

/** Header names and values as bytes may carry them: anything Node's parser may meet. */
const junkHeader = fc.tuple(
  fc.oneof(
    fc.constantFrom(
      "expect",
      "upgrade",
      "connection",
      "host",
      "te",
      "trailer",
      "x-forwarded-for",
      "cookie",
      "accept-encoding",
      "if-modified-since",
    ),
    fc.string({ unit: "binary-ascii", minLength: 1, maxLength: 12 }),
  ),
  fc.oneof(
    fc.constantFrom("100-continue", "websocket", "upgrade", "keep-alive", "close", "h2c", "", "gzip, br"),
    fc.string({ unit: "binary-ascii", maxLength: 30 }),
    fc.string({ maxLength: 20 }),
  ),
);

const requestArb = fc.record({
  method: fc.oneof(
    { weight: 16, arbitrary: fc.constantFrom(...METHODS) },
    { weight: 1, arbitrary: fc.constantFrom(...ODD_METHODS) },
    { weight: 1, arbitrary: fc.string({ unit: "binary-ascii", minLength: 1, maxLength: 8 }) },
  ),
  form: fc.constantFrom(...TARGET_FORMS),
  path: pathArb,
  idIndex: fc.nat(),
  query: queryArb,
  headers: fc.array(fc.tuple(headerNameArb, headerValueArb), { maxLength: 6 }),
  // Raw junk in one case of four: most cases should reach the router, not Node's parser.
  junk: fc.oneof(
    { weight: 3, arbitrary: fc.constant([] as Array<[string, string]>) },
    { weight: 1, arbitrary: fc.array(junkHeader, { minLength: 1, maxLength: 3 }) },
  ),
  auth: authArb,
  body: fc.option(fc.oneof(fc.uint8Array({ maxLength: 64 }), fc.constant(new Uint8Array(5000))), { nil: undefined }),
  framing: fc.constantFrom("length", "length", "length", "chunked", "chunked", "bad-chunked"),
  which: fc.boolean(),
});

type FuzzRequest = typeof requestArb extends fc.Arbitrary<infer T> ? T : never;

/** A request's bytes. Field values Node's parser would refuse are sent all the same. */
function encode(r: FuzzRequest, ids: readonly string[]): Buffer {
  const path = r.path.map((s) => (s === "<id>" ? ids[r.idIndex % ids.length]! : s)).join("/");
  const originForm = `/${path}${r.query ? `?${r.query}` : ""}`;
  const target =
    r.form === "absolute"
      ? `http://depot.example${originForm}`
      : r.form === "asterisk"
        ? "*"
        : r.form === "double-slash"
          ? `/${originForm}`
          : originForm;
  const lines = [`${r.method} ${target} HTTP/1.1`, "Host: depot.example"];
  // The depot's own headers with values a client can send (as the in-process target drops
  // what Headers refuses); the junk goes as it is, whatever Node's parser makes of it.
  for (const [name, value] of r.headers) if (/^[\t\x20-\x7e\x80-\xff]*$/.test(value)) lines.push(`${name}: ${value}`);
  for (const [name, value] of r.junk) lines.push(`${name}: ${value}`);
  if (r.auth) lines.push(`Authorization: ${r.auth}`);
  let body = Buffer.alloc(0);
  if (r.body !== undefined) {
    if (r.framing === "length") {
      lines.push(`Content-Length: ${r.body.length}`);
      body = Buffer.from(r.body);
    } else {
      lines.push("Transfer-Encoding: chunked");
      const size = r.framing === "bad-chunked" ? "zz" : r.body.length.toString(16);
      body = Buffer.concat([Buffer.from(`${size}\r\n`), Buffer.from(r.body), Buffer.from("\r\n0\r\n\r\n")]);
      if (r.body.length === 0 && r.framing === "chunked") body = Buffer.from("0\r\n\r\n");
    }
  }
  lines.push("Connection: close");
  return Buffer.concat([Buffer.from(`${lines.join("\r\n")}\r\n\r\n`, "latin1"), body]);
}

describe("depot router fuzz through real sockets (servePackageRouter)", () => {
  const servers: PackageServer[] = [];
  const ids: string[][] = [];
  const errors: unknown[] = [];
  let cleanup: () => Promise<void> = async () => {};
  // Handler faults (servePackageRouter logs them as errors) fail the target too.
  const collecting: Logger = {
    ...silentLogger,
    child: () => collecting,
    error: (fields: unknown) => void errors.push(fields),
  };

  beforeAll(async () => {
    const made = await tempDir();
    cleanup = made.cleanup;
    // The fs store takes upload bodies natively (Node streams), the memory store through
    // the portable path; the second router checks auth on a public-read depot.
    const plain = createPackageRouter(createFsStore(made.dir, { unsafeNoSync: true }), {
      onError: (e) => errors.push(e),
      limits: { itemBytes: 4096, items: 200 },
    });
    const authed = createPackageRouter(createMemoryStore(), {
      onError: (e) => errors.push(e),
      authorize: bearerTokens({ [TOKEN]: ["pkg*"] }, { publicRead: true }),
    });
    for (const router of [plain, authed]) {
      ids.push(await seedDepot((request) => router.fetch(request)));
      const deadlines = { headersTimeoutMs: 2_000, keepAliveTimeoutMs: 2_000, bodyIdleMs: 2_000, sendIdleMs: 2_000 };
      servers.push(await servePackageRouter(router, { ...deadlines, logger: collecting }));
    }
  });
  afterAll(async () => {
    for (const server of servers) await server.close();
    await cleanup();
    expect(errors).toEqual([]);
  });

  it(
    "one whole answer per request, never a 5xx; every error a documented problem",
    async () => {
      for (const params of fuzzParams<[FuzzRequest]>("depot router over HTTP")) {
        await fc.assert(
          fc.asyncProperty(requestArb, async (r) => {
            const which = r.which ? 1 : 0;
            const head = r.method === "HEAD";
            const label = `${r.method} ${r.form} /${r.path.join("/")}`;
            const response = await exchange(servers[which]!.port, encode(r, ids[which]!), head);
            expect(response.status, label).toBeLessThan(500);
            if (response.status >= 400) {
              expect(response.headers.get("content-type"), label).toBe("application/problem+json");
              if (!head) {
                const problem = JSON.parse(response.body.toString("utf8")) as { code: string; status: number };
                expect(DOCUMENTED_CODES.has(problem.code), `${label}: ${problem.code}`).toBe(true);
                expect(problem.status, label).toBe(response.status);
              }
            }
          }),
          params,
        );
      }
    },
    fuzzTimeout(300_000),
  );
});
