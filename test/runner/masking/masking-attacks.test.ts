/**
 * Attacks on secret masking through the real interfaces (a real server over h2c, a client that
 * does not mask, `runJob` with a real child process): each test is a hole that was found and
 * fixed, kept so it stays closed (RELIABILITY.md, "Secret masking").
 */
import { randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { toNodeHandler } from "srvx/node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createConsole } from "../../../src/console/index.js";
import { runJob } from "../../../src/runner/agent/run-job.js";
import { createRunnerClient } from "../../../src/runner/client/runner-client.js";
import { createRunnerService, type RunnerService } from "../../../src/runner/index.js";
import type { JobLogStore } from "../../../src/runner/ports.js";
import { startRunnerServer, type RunnerServer } from "../../../src/runner/server/start-server.js";

let dir: string;
let logs: JobLogStore;
let runner: RunnerService;
let server: RunnerServer;

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "runner-depot-mask-attacks-"));
  logs = createFsLogStore(path.join(dir, "logs"), { fsync: false });
  runner = createRunnerService(createMemoryQueue(), { logs });
  server = await startRunnerServer(runner, { port: 0 });
});

afterAll(async () => {
  await server?.close();
  await runner?.close();
  await logs?.close?.();
  await rm(dir, { recursive: true, force: true });
});

const clientFor = (requestId: string) =>
  createRunnerClient({ endpoint: `http://127.0.0.1:${server.port}`, requestId, token: "" });

async function storedLines(requestId: string): Promise<string[]> {
  return (await logs.read(requestId, 0, 100_000)).map((l) => l.line);
}

/** A 3,000-byte value in which no 24-byte run repeats. */
const longValue = () => Array.from({ length: 250 }, (_, i) => `v${String(i * 7919).padStart(10, "0")}`).join("");

/** Fails when any 24-byte piece of `secret` is in `text`. */
function expectNoPieceOf(text: string, secret: string, where: string): void {
  for (let at = 0; at + 24 <= secret.length; at += 24)
    expect(text.includes(secret.slice(at, at + 24)), `${where}: bytes ${at}… of a registered value`).toBe(false);
}

/** Runs `script` (node -e) through runJob with a 1 KiB line limit and the echo named; its stored lines and echo. */
async function runEchoed(
  script: string,
  echo: "none" | "lines" | "bytes",
): Promise<{ lines: string[]; echoed: string[] }> {
  const requestId = randomUUID();
  await runner.expectJob(requestId, {});
  const client = clientFor(requestId);
  const echoed: string[] = [];
  const exitCode = await runJob(client, {
    command: process.execPath,
    args: ["-e", script],
    maxLineBytes: 1024,
    ...(echo === "lines" ? { onLine: (line: string) => echoed.push(line) } : {}),
    ...(echo === "bytes" ? { onOutput: (bytes: Buffer) => echoed.push(bytes.toString("utf8")) } : {}),
  });
  await client.close();
  expect(exitCode).toBe(0);
  return { lines: await storedLines(requestId), echoed };
}

describe("masking attacks", () => {
  it("::add-mask:: values sharing a prefix cannot make the service compare them at every byte: the line is masked whole", async () => {
    // 300 values "A…A?A…A" (the odd byte at each position) and a line of 'A's: before the scan had a budget,
    // each byte of the line compared ~300 forms of ~250 bytes (≈ 10^9 byte compares for this line, and
    // 8.6 s of the service's one thread for a 64 KiB line with 1,024 values: every other job stalled).
    const requestId = randomUUID();
    await runner.expectJob(requestId, {});
    const client = clientFor(requestId);
    for (let k = 0; k < 300; k++) {
      client.log(
        `::add-mask::${"A".repeat(k % 250)}${String.fromCharCode(0x42 + Math.floor(k / 250))}${"A".repeat(250 - (k % 250))}`,
      );
    }
    client.log("::add-mask::ordinary-token-1234");
    client.log("A".repeat(16 * 1024));
    client.log("after ordinary-token-1234 end");
    await client.end({ exitCode: 0, success: true, repoUrl: "", commitSha: "" });
    await client.close();
    const lines = await storedLines(requestId);
    expect(lines.slice(0, 301).every((l) => l === "::add-mask::***")).toBe(true);
    // Over the scan's budget, the line fails closed (masked whole) rather than being scanned on.
    expect(lines[301]).toBe("***");
    // An ordinary line holding a value is still masked exactly.
    expect(lines[302]).toBe("after *** end");
  });

  it("a declared value is masked as Python's, PHP's and Go's JSON and Python's percent-encoders write it", async () => {
    // Each line below was printed by the named encoder (python3 json.dumps / urllib.parse.quote,
    // quote_plus; PHP json_encode; Go json.Marshal) for this value; before, only JSON.stringify's
    // escaping and encodeURIComponent's were forms, so all but the last line leaked it whole.
    const secret = "pä/ss+w<rd> 9&k";
    const requestId = randomUUID();
    await runner.expectJob(requestId, { secrets: [secret] });
    const client = clientFor(requestId);
    const printed = [
      String.raw`python json: "p\u00e4/ss+w<rd> 9&k"`,
      String.raw`php json: "p\u00e4\/ss+w<rd> 9&k"`,
      String.raw`go json: "pä/ss+w\u003crd\u003e 9\u0026k"`,
      String.raw`upper: "P\u00E4/ss+w<rd> 9&k"`.replace("P", "p"),
      "python quote: https://h/p%C3%A4/ss%2Bw%3Crd%3E%209%26k",
      "python quote lower: https://h/p%c3%a4/ss%2bw%3crd%3e%209%26k",
      "python quote_plus: a=p%C3%A4%2Fss%2Bw%3Crd%3E+9%26k",
      "encodeURIComponent: a=p%C3%A4%2Fss%2Bw%3Crd%3E%209%26k",
    ];
    for (const line of printed) client.log(line);
    await client.end({ exitCode: 0, success: true, repoUrl: "", commitSha: "" });
    await client.close();
    const lines = await storedLines(requestId);
    expect(lines).toHaveLength(printed.length);
    lines.forEach((line, i) => expect(line, printed[i]).toMatch(/^[a-zA-Z_ ]+: (a=|"|https:\/\/h\/)?\*\*\*"?$/));
  });

  for (const echo of ["none", "lines", "bytes"] as const) {
    it(`an ::add-mask:: line over the agent's line limit is never stored or echoed in clear (local echo: ${echo})`, async () => {
      // A 3,000-byte value (no 24-byte run repeats) registered by a line over the 1 KiB line limit, once
      // newline-terminated on stdout and once unterminated on stderr (the last output), and printed again between.
      const value = longValue();
      const other = value.replace(/v/g, "w");
      const script = [
        `process.stdout.write("::add-mask::" + ${JSON.stringify(value)} + "\\n");`,
        `process.stdout.write("again " + ${JSON.stringify(value)} + "\\n");`,
        `process.stderr.write("::add-mask::" + ${JSON.stringify(other)});`,
      ].join("\n");
      const { lines, echoed } = await runEchoed(script, echo);
      for (const [where, seen] of [
        ["stored", lines],
        ["echoed", echoed],
      ] as const) {
        for (const secret of [value, other]) expectNoPieceOf(seen.join("\n"), secret, where);
      }
      expect(lines).toContain("again ***");
    });
  }

  it("the agent sends a pipe read's lines before the first that needs masking in one call, the rest one by one", async () => {
    // The service knows no secret here, so a declared value the agent leaves is stored in clear. Three writes,
    // 50 ms apart: a declared value among plain lines; a command and its value among plain lines (the service would
    // mask this one itself, so only what the agent sends shows it); plain lines only, on stderr (a pipe of their own,
    // so no read can join them to the others).
    const declared = "declared-to-the-agent-only";
    const plain = (tag: string) => Array.from({ length: 200 }, (_, i) => `${tag} ${i} ${"p".repeat(60)}`);
    const writes = [
      [...plain("a"), `x ${declared} y`],
      ["::add-mask::run-registered-value", "z run-registered-value", ...plain("b")],
      plain("c"),
    ];
    const script = writes
      .map(
        (w, i) =>
          `setTimeout(() => process.${i === 2 ? "stderr" : "stdout"}.write(${JSON.stringify(w.join("\n") + "\n")}), ${i * 50});`,
      )
      .join("\n");
    const requestId = randomUUID();
    await runner.expectJob(requestId, {});
    const real = clientFor(requestId);
    const client = Object.create(real) as typeof real;
    const sent: string[] = [];
    const taken: string[] = [];
    client.logLines = (src, start, end, stderr, time, max) => {
      const r = real.logLines!(src, start, end, stderr, time, max);
      taken.push(...Buffer.from(src).toString("utf8", start, r.next).split("\n").slice(0, -1));
      return r;
    };
    client.logUtf8 = (src, start, end, stderr, time) => (
      sent.push(Buffer.from(src).toString("utf8", start, end)),
      real.logUtf8!(src, start, end, stderr, time)
    );
    client.log = (line, stderr, time) => (sent.push(line), real.log(line, stderr, time));
    expect(await runJob(client, { command: process.execPath, args: ["-e", script], secrets: [declared] })).toBe(0);
    await real.close();
    const stored = await logs.read(requestId, 0, 100_000);
    const lines = (stderr: boolean) => stored.filter((l) => l.stderr === stderr).map((l) => l.line);
    expect(lines(false)).toEqual([...plain("a"), "x *** y", "::add-mask::***", "z ***", ...plain("b")]);
    expect(lines(true)).toEqual(plain("c"));
    // Nothing the agent handed the client holds a value or a command in clear; the plain write went whole.
    expect([...sent, ...taken].filter((l) => /declared-to|run-registered/.test(l))).toEqual([]);
    expect(taken).toEqual(expect.arrayContaining([...plain("a"), ...plain("c")]));
    expect(sent).toContain("x *** y");
  });

  // Found by a review of the runs of lines (2026-11-30): a splitter that offered a run while a cut command's value was
  // still coming, or that did not end a cut line at a run, stored the value's later pieces in clear.
  const cutCases = [
    {
      name: "a cut ::add-mask:: whose newline comes in a later read",
      writes: (value: string) => [`::add-mask::${value}`, `\nagain ${value}\nplain\n`],
    },
    {
      name: "a cut plain line, then a run, then a cut ::add-mask::",
      writes: (value: string) => ["x".repeat(2000), `\nplain\n::add-mask::${value}`, `\nagain ${value}\n`],
    },
  ];
  for (const c of cutCases) {
    for (const echo of ["none", "bytes"] as const) {
      it(`${c.name}: never stored or echoed in clear (local echo: ${echo})`, async () => {
        const value = longValue();
        const script = c
          .writes(value)
          .map((w, i) => `setTimeout(() => process.stdout.write(${JSON.stringify(w)}), ${i * 100});`)
          .join("\n");
        const { lines, echoed } = await runEchoed(script, echo);
        const text = [...lines, ...echoed].join("\n");
        expectNoPieceOf(text, value, "stored or echoed");
        expect(text).toContain("again ***");
      });
    }
  }

  it("held: stderr registration, a 3-byte value, and the console's raw download with times and SSE", async () => {
    // The service alone knows DECLARED (an agent given no secrets); the job registers one value on stderr
    // and tries a 3-byte one. Nothing registered or declared reaches the store or the console.
    const declared = "declared-only-to-the-service";
    const script = [
      `console.error("::add-mask::stderr-registered-value");`,
      `console.log("::add-mask::xyz");`,
      `console.log("a stderr-registered-value b ${declared} c");`,
    ].join("\n");
    const requestId = randomUUID();
    await runner.expectJob(requestId, { secrets: [declared] });
    const client = clientFor(requestId);
    expect(await runJob(client, { command: process.execPath, args: ["-e", script] })).toBe(0);
    await client.close();
    const lines = await storedLines(requestId);
    expect(lines).toContain("::add-mask::***");
    expect(lines).toContain("a *** b *** c");
    // The refusal names the size, never the value; the command line holding it is masked all the same.
    expect(lines.filter((l) => l === "::add-mask::***")).toHaveLength(2);
    expect(lines.some((l) => l.includes("value not registered: a secret must be at least 4 bytes (got 3)"))).toBe(true);
    expect(lines.some((l) => l.includes("xyz"))).toBe(false);

    const web = createConsole({ runner });
    const http2 = http.createServer(toNodeHandler((r: Request) => web.fetch(r)) as unknown as http.RequestListener);
    await new Promise<void>((resolve) => http2.listen(0, "127.0.0.1", resolve));
    try {
      const base = `http://127.0.0.1:${(http2.address() as net.AddressInfo).port}/api/jobs/${requestId}`;
      for (const url of [`${base}/raw?timestamps=1`, `${base}/raw`, `${base}/events?from=0`]) {
        const response = await fetch(url);
        expect(response.status, url).toBe(200);
        const body = await response.text();
        expect(body, url).toContain("a *** b *** c");
        expect(body.includes("stderr-registered-value") || body.includes(declared), url).toBe(false);
      }
    } finally {
      http2.closeAllConnections();
      await new Promise<void>((resolve) => http2.close(() => resolve()));
    }
  });

  it("expectJob called again keeps the values the job registered with ::add-mask:: in the service", async () => {
    // An orchestrator that retries expectJob mid-job made the service forget what an agent that does not
    // mask had registered, so the value printed afterwards was stored in clear.
    const requestId = randomUUID();
    await runner.expectJob(requestId, { secrets: ["first-declared-value"] });
    const client = clientFor(requestId);
    client.log("::add-mask::registered-before-the-retry");
    await client.flush?.();
    await expect.poll(async () => (await storedLines(requestId)).length).toBe(1);
    await runner.expectJob(requestId, { secrets: ["second-declared-value"] });
    client.log("x registered-before-the-retry first-declared-value second-declared-value y");
    await client.end({ exitCode: 0, success: true, repoUrl: "", commitSha: "" });
    await client.close();
    expect(await storedLines(requestId)).toEqual(["::add-mask::***", "x *** *** *** y"]);
  });

  it("a value with surrounding blanks or quotes is masked without them too", async () => {
    // A secret read from a file or a variable keeps blanks or quotes the job's shell strips: before, only
    // the padded spelling was a form, so the value the job actually printed was stored in clear.
    const requestId = randomUUID();
    await runner.expectJob(requestId, { secrets: ["  padded-secret-value\t", `"quoted-secret-value"`] });
    const client = clientFor(requestId);
    client.log("::add-mask:: registered-with-a-space");
    client.log("a padded-secret-value b quoted-secret-value c registered-with-a-space d");
    await client.end({ exitCode: 0, success: true, repoUrl: "", commitSha: "" });
    await client.close();
    // The registered value holds its leading space, so the run masked takes the space with it.
    expect(await storedLines(requestId)).toEqual(["::add-mask::***", "a *** b *** c*** d"]);
  });
});
