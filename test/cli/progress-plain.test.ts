/**
 * Progress off a terminal (a CI log, a pipe): plain lines at most once per interval, and
 * the last amount always printed when it stops (issue 29: a log ended at "0 B of 6 B").
 */
import { Writable } from "node:stream";
import { describe, expect, it } from "vitest";
import { createProgress } from "../../src/cli/progress.js";

function sink(): { stream: NodeJS.WriteStream; text: () => string } {
  let text = "";
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      text += chunk.toString("utf8");
      done();
    },
  });
  return { stream: stream as unknown as NodeJS.WriteStream, text: () => text };
}

describe("progress without a terminal", () => {
  it("prints the final amount at stop even when the interval has not passed", () => {
    const { stream, text } = sink();
    const progress = createProgress("publish hello@1.0.0", stream, { intervalMs: 60_000 });
    progress.update(0, 6);
    progress.update(6, 6);
    progress.stop("published hello@1.0.0");
    const lines = text().trimEnd().split("\n");
    expect(lines).toHaveLength(3);
    expect(lines[0]).toMatch(/^publish hello@1\.0\.0: 0 B of 6 B, /);
    expect(lines[1]).toMatch(/^publish hello@1\.0\.0: 6 B of 6 B, /);
    expect(lines[2]).toBe("published hello@1.0.0");
  });

  it("does not repeat a final amount it already printed", () => {
    const { stream, text } = sink();
    const progress = createProgress("install", stream, { intervalMs: 0 });
    progress.update(6, 6);
    progress.stop();
    expect(text().trimEnd().split("\n")).toHaveLength(1);
  });
});
