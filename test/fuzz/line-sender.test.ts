/**
 * Property test of the agent's sending step (src/runner/agent/line-sender.ts): a sender whose
 * client takes runs of lines (`logLines`) and one whose client takes a line a call must hand
 * over the same lines in the same order, and echo the same bytes, for any output: secrets and
 * their forms (one beginning with a newline, a multi-line one), `::add-mask::` commands, lines
 * over the limit, any cut into reads, stdout and stderr interleaved, and a stop at any read.
 * Deterministic (no child, no timing), so every case reaches the runs' edges.
 */
import { Buffer } from "node:buffer";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { createLineSender } from "../../src/runner/agent/line-sender.js";
import type { RunnerClient } from "../../src/runner/client/runner-client.js";
import { createSecretMasker } from "../../src/runner/masking/secret-masker.js";
import { fuzzParams, fuzzTimeout } from "./settings.js";

/** What a fake client was handed: each line as `O:` or `E:` and its text, how many runs, and the echo. */
interface Handed {
  lines: string[];
  runs: number;
  echo: string[];
}

const text = (src: Uint8Array, start: number, end: number) =>
  Buffer.from(src.buffer, src.byteOffset, src.byteLength).toString("utf8", start, end);

/** A client that records what it is handed, with `logLines` (taking lines as the real one does) or without. */
function fakeClient(handed: Handed, withRuns: boolean, clientMax: number): RunnerClient {
  const client = {
    log(line: string, stderr = false) {
      handed.lines.push(`${stderr ? "E" : "O"}:${line}`);
      return true;
    },
    logUtf8: (src: Uint8Array, start: number, end: number, stderr = false) => client.log(text(src, start, end), stderr),
    logLines: withRuns
      ? (src: Uint8Array, start: number, end: number, stderr = false, _time = 0, max = clientMax) => {
          const buf = Buffer.from(src.buffer, src.byteOffset, src.byteLength);
          let pos = start;
          while (pos < end) {
            const nl = buf.indexOf(10, pos);
            if (nl === -1 || nl >= end || nl - pos > Math.min(max, clientMax)) break;
            handed.lines.push(`${stderr ? "E" : "O"}:${buf.toString("utf8", pos, nl)}`);
            pos = nl + 1;
          }
          if (pos > start) handed.runs++;
          return { next: pos, accepted: true };
        }
      : undefined,
  };
  return client as unknown as RunnerClient;
}

const SECRETS = ["s3cr3tvalue", "\nlead-nl-secret", "multi\nline-secret", "abcd"];
const token = fc.constantFrom(
  ...["a", "b ", "\n", "\n", "s3cr3t", "value", "s3cr3tvalue", "::add-mask::", "::add-mask::regval1", "regval1"],
  ...["lead-nl-secret", "multi", "line-secret", "abcd", "ab", "cd", "  ", "é", "x".repeat(30), "czNjcjN0dmFsdWU"],
  "%0A",
);
type Case = { toks: string[]; cuts: number[]; max: number; declared: string[]; stopAt: number };
const cases: fc.Arbitrary<Case> = fc.record({
  toks: fc.array(token, { maxLength: 60 }),
  cuts: fc.array(fc.nat(400), { maxLength: 8 }),
  max: fc.integer({ min: 8, max: 40 }),
  declared: fc.subarray(SECRETS),
  stopAt: fc.integer({ min: -1, max: 6 }),
});

/** Feeds the case's output through a sender over a fake client; every third read goes to stderr. */
function send(c: Case, withRuns: boolean): Handed {
  const handed: Handed = { lines: [], runs: 0, echo: [] };
  let pushes = 0;
  const sender = createLineSender(fakeClient(handed, withRuns, 1000), {
    masker: createSecretMasker(c.declared),
    maxLineBytes: c.max,
    stopped: () => c.stopAt >= 0 && pushes > c.stopAt,
    accepted: () => {},
    onOutput: (bytes, stderr) => handed.echo.push(`${stderr ? "E" : "O"}:${bytes.toString("utf8")}`),
  });
  const bytes = Buffer.from(c.toks.join(""));
  const cuts = [...new Set(c.cuts.map((x) => x % (bytes.length + 1)))].sort((a, b) => a - b);
  let from = 0;
  for (const cut of [...cuts, bytes.length]) {
    if (cut <= from) continue;
    pushes++;
    // A copy a read, as the pipe reader's reused buffer is only valid during the call.
    (pushes % 3 === 2 ? sender.stderr : sender.stdout).push(Buffer.from(bytes.subarray(from, cut)));
    from = cut;
  }
  sender.stdout.end();
  sender.stderr.end();
  return handed;
}

const echoOf = (h: Handed, stream: "O" | "E") =>
  h.echo
    .filter((e) => e.startsWith(`${stream}:`))
    .map((e) => e.slice(2))
    .join("");

describe("fuzz: the agent's sending step, runs of lines against a line a call", () => {
  it(
    "hands over the same lines in the same order and echoes them, whatever the secrets, commands and reads",
    () => {
      let runs = 0;
      for (const params of fuzzParams<[Case]>("line sender runs")) {
        fc.assert(
          fc.property(cases, (c) => {
            const whole = send(c, true);
            const single = send(c, false);
            runs += whole.runs;
            expect(whole.lines).toEqual(single.lines);
            for (const stream of ["O", "E"] as const) {
              expect(echoOf(whole, stream)).toBe(echoOf(single, stream));
              const stored = whole.lines.filter((l) => l.startsWith(`${stream}:`)).map((l) => `${l.slice(2)}\n`);
              expect(echoOf(whole, stream)).toBe(stored.join(""));
            }
          }),
          params,
        );
      }
      // The property is about runs: they must have been taken.
      expect(runs).toBeGreaterThan(0);
    },
    fuzzTimeout(30_000),
  );

  it("sends the lines around one that needs masking in runs, and that line alone", () => {
    const handed: Handed = { lines: [], runs: 0, echo: [] };
    const sender = createLineSender(fakeClient(handed, true, 1000), {
      masker: createSecretMasker(["s3cr3tvalue"]),
      maxLineBytes: 100,
      stopped: () => false,
      accepted: () => {},
    });
    sender.stdout.push(Buffer.from("one\ntwo\nthe s3cr3tvalue\nfour\nfive\n"));
    expect(handed.lines).toEqual(["O:one", "O:two", "O:the ***", "O:four", "O:five"]);
    // one + two, then four + five: a read with a secret in it loses only that line's run.
    expect(handed.runs).toBe(2);
  });

  it("forgets where the last read's commands were: the next read, in the same buffer, is searched anew", () => {
    // Read 0 holds no command; read 1, in the same buffer (the pipe reader reuses its memory), holds one.
    const reads = ["abc\n" + "d\n".repeat(14), "::add-mask::zzzzzz\nr zzzzzz\n" + "p\n".repeat(2)];
    const outputs = [true, false].map((withRuns) => {
      const handed: Handed = { lines: [], runs: 0, echo: [] };
      const sender = createLineSender(fakeClient(handed, withRuns, 1000), {
        masker: createSecretMasker([]),
        maxLineBytes: 100,
        stopped: () => false,
        accepted: () => {},
      });
      const buf = Buffer.alloc(32);
      for (const r of reads) {
        expect(buf.write(r)).toBe(32);
        sender.stdout.push(buf);
      }
      return handed.lines;
    });
    expect(outputs[0]).toEqual(outputs[1]);
    expect(outputs[0]!.join("\n")).not.toContain("zzzzzz");
    expect(outputs[0]!.slice(15)).toEqual(["O:::add-mask::***", "O:r ***", "O:p", "O:p"]);
  });

  it("masks the lines after a command in the same read with the value it registered, in runs again after them", () => {
    const handed: Handed = { lines: [], runs: 0, echo: [] };
    const sender = createLineSender(fakeClient(handed, true, 1000), {
      masker: createSecretMasker([]),
      maxLineBytes: 100,
      stopped: () => false,
      accepted: () => {},
    });
    sender.stdout.push(Buffer.from("a\n::add-mask::fresh-value\nb fresh-value\nc\nd\n"));
    expect(handed.lines).toEqual(["O:a", "O:::add-mask::***", "O:b ***", "O:c", "O:d"]);
    expect(handed.runs).toBe(2);
    // The next read comes in the same buffer (the pipe reader reuses its memory), holding a command the last did not.
    const read = Buffer.from("e\nf\ng\nh other-value\n::add-mask::x1y2\nplain line\n");
    sender.stdout.push(read);
    read.write("e\n::add-mask::other-value\nf other-value\nx1y2 ab\n");
    sender.stdout.push(read);
    expect(handed.lines.slice(5)).toEqual(
      ["e", "f", "g", "h other-value", "::add-mask::***", "plain line", "e", "::add-mask::***", "f ***", "*** ab"].map(
        (l) => `O:${l}`,
      ),
    );
  });
});
