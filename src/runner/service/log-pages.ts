/**
 * A stored log read a page at a time, as the readers that go through a whole log or section do (the raw download, the
 * control API's log, a provenance digest): each page at most `lines` lines and `maxBytes` of them (and one line), and
 * the end at `to` or at the first empty page (a short page is the byte bound's, not the log's end).
 */
import type { JobLogStore, StoredLine } from "../ports.js";
import { positionAfter } from "./log-tail.js";

/** How big a page of {@link logPages} is. */
export interface LogPageSize {
  lines: number;
  maxBytes: number;
}

/**
 * Pages of job `id`'s stored lines from position `from` to `to` (exclusive), read only as they are asked for: O(page)
 * memory a reader, one store read a page.
 *
 * @example
 * for await (const page of logPages(logs, id, 0, state.storedLines, { lines: 1000, maxBytes: 1 << 20 })) send(page);
 */
export async function* logPages(
  logs: JobLogStore,
  id: string,
  from: number,
  to: number,
  size: LogPageSize,
): AsyncGenerator<StoredLine[]> {
  while (from < to) {
    const page = await logs.read(id, from, Math.min(size.lines, to - from), { maxBytes: size.maxBytes });
    if (page.length === 0) return;
    yield page;
    // A drop marker stands for itself and the positions after it that hold no line (log-tail.ts).
    from = positionAfter(from, page);
  }
}
