/**
 * The console's live tail (`api/jobs/<id>/events`) over a cut log (docs/decisions/log-tail.md), real sockets: the
 * lines went to a runner server over gRPC, the stream is read with fetch from the console on node:http. Each `lines`
 * event's `from` is the position of its first line, so the events follow one another with no gap or repeat across
 * the drop marker (an attack round found the batch holding the marker sent `from` too high by its `skipped`, and the
 * page then dropped every later batch), and a stream started inside the dropped range begins with the marker there.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startConsoleHttp, type ConsoleHttp } from "../fixtures/console-http.js";

const LINES = 4_000;
let stack: ConsoleHttp;
let runner: ConsoleHttp["runner"];
let url: string;
const id = randomUUID();

beforeAll(async () => {
  stack = await startConsoleHttp({ limits: { jobLogBytes: 200_000, tailBytes: 40_000 } });
  ({ runner, url } = stack);
  await stack.job(
    id,
    Array.from({ length: LINES }, (_, i) => `line ${i} ${"x".repeat(80)}`),
  );
}, 120_000);

afterAll(async () => {
  await stack?.close();
});

type Wire = [string, number, number?, number?];

/** The `lines` events of the ended job's stream from `from`, and the `end` event's id. */
async function events(from: number): Promise<{ batches: { id: number; from: number; lines: Wire[] }[]; end: number }> {
  const text = await (await fetch(`${url}/api/jobs/${id}/events?from=${from}`)).text();
  const batches: { id: number; from: number; lines: Wire[] }[] = [];
  let end = -1;
  for (const event of text.split("\n\n")) {
    const eventId = Number(/^id: (\d+)$/m.exec(event)?.[1]);
    if (event.startsWith("event: end")) end = eventId;
    if (!event.startsWith("event: lines")) continue;
    const data = JSON.parse(/^data: (.*)$/m.exec(event)![1]!) as { from: number; lines: Wire[] };
    batches.push({ id: eventId, ...data });
  }
  return { batches, end };
}

/** The position after a batch from `from`: a drop marker stands for itself and its `skipped` (the page's count). */
const after = (from: number, lines: Wire[]) => lines.reduce((n, line) => n + 1 + (line[3] ?? 0), from);

describe("the console's live tail over a cut log", () => {
  it("sends each batch from its first line's position, across the drop marker, to the end", async () => {
    const state = (await runner.logs.get(id))!;
    expect(state.cut?.lines).toBeGreaterThan(0);
    const { batches, end } = await events(0);
    let position = 0;
    for (const batch of batches) {
      expect(batch.from).toBe(position);
      position = after(batch.from, batch.lines);
      expect(batch.id).toBe(position);
    }
    expect(position).toBe(state.storedLines);
    expect(end).toBe(state.storedLines);
    const markers = batches.flatMap((b) => b.lines).filter((line) => line[3] !== undefined);
    expect(markers).toHaveLength(1);
  });

  it("started inside the dropped range, begins with the marker at that position and goes on to the tail", async () => {
    const cut = (await runner.logs.get(id))!.cut!;
    const inside = cut.at + Math.floor(cut.lines / 2);
    const { batches } = await events(inside);
    expect(batches[0]!.from).toBe(inside);
    const marker = batches[0]!.lines[0]!;
    expect(inside + 1 + marker[3]!).toBe(cut.at + 1 + cut.lines);
    expect(batches[0]!.id).toBe(after(inside, batches[0]!.lines));
  });
});
