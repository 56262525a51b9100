/**
 * Following a job's stored lines: the ones so far, then new ones as they are stored.
 * Followers of one job share its tail (runner/service/fanout.ts): lines stored by this replica reach
 * them without a store read, lines stored by another replica with one read per replica
 * (woken by the store's `watch`, else by the tail's poll). A follower behind the tail's
 * ring reads the store by offset, a page at a time, until it is back in the ring.
 */
import { positionAfter } from "./log-tail.js";
import type { LogSectionEvent, StoredLine } from "../ports.js";
import { foldSections, mayHoldMarker, sectionsBefore } from "./log-sections.js";
import type { RunnerCore } from "./job-table.js";
import { FOLLOW_PAGE, FOLLOW_PAGE_BYTES, type JobTail } from "./fanout.js";

/**
 * Stored lines of job `id` from `from` until the job ends; see RunnerService.follow.
 * Memory per follower: one page (at most FOLLOW_PAGE lines and FOLLOW_PAGE_BYTES and one line); the ring
 * is per job and shared. A slow consumer only delays its own reads.
 */
export async function* followJob(
  core: RunnerCore,
  id: string,
  from: number,
  signal?: AbortSignal,
): AsyncGenerator<StoredLine> {
  const fanout = core.fanout;
  const tail = fanout.attach(id);
  let position = from;
  // Where this follower is, for the ring to drop what every follower has passed.
  const cursor = { position };
  tail.join(cursor);
  let pageLines = FOLLOW_PAGE;
  // A job unknown at the start may still be on its way (a VM that has not spoken yet):
  // it gets the lost-job window to appear, like a job registered with expectJob.
  const appearBy = Date.now() + core.config.lostAfterMs;
  let wake: (() => void) | null = null;
  const onAbort = () => wake?.();
  signal?.addEventListener("abort", onAbort);
  try {
    for (;;) {
      if (signal?.aborted || core.closed) return;
      // At the live end: lines from the shared ring.
      if (tail.start >= 0 && position >= tail.start && position < tail.end) {
        const page = tail.slice(position, pageLines);
        for (const line of page) yield line;
        position += page.length;
        cursor.position = position;
        tail.trim();
        continue;
      }
      // A state read in flight (another follower's) may be the one that says the job ended.
      if (tail.stale || tail.refreshing) await fanout.refresh(tail);
      if (position < tail.known) {
        if (tail.start >= 0 && position === tail.end) {
          // The followers at the ring's end share one read of what another replica stored.
          await fanout.fill(tail, position);
          if (tail.end > position) continue;
        } else {
          // Behind the ring (or ahead of it): this follower's own read, by offset.
          const page = await core.logs.read(id, position, pageLines, { maxBytes: FOLLOW_PAGE_BYTES });
          if (page.length > 0) {
            pageLines = nextPageLines(page);
            for (const line of page) yield line;
            // A drop marker stands for the positions after it that hold no line any more (log-tail.ts).
            position = positionAfter(position, page);
            cursor.position = position;
            continue;
          }
          // Nothing where lines should be: an ended job's are gone (an archive removed).
          tail.stale = true;
          await fanout.refresh(tail);
          if (tail.state && tail.state.status !== "open") return;
        }
        // Neither read gave lines: wait for the next event or poll instead of asking again.
      }
      const state = tail.state;
      // Pruned while followed, or never appeared: nothing more will come.
      if (!state && (tail.seen || Date.now() >= appearBy)) return;
      if (state && state.status !== "open" && position >= state.storedLines) return;
      if (tail.exhausted && position >= tail.end) return;
      // An event came while the state was being read: read it again before sleeping.
      if (tail.stale || tail.refreshing) continue;
      // Nothing known past here: wait at the live end, where the ring starts if it has not.
      // Anchored at most at what is known: a follower asking for a far-future `from` must not
      // park the shared ring where no line will reach it (every other follower would then
      // read the store itself). An empty ring left ahead of the known end moves back.
      if (tail.start < 0 || (tail.end === tail.start && tail.start > tail.known))
        tail.reset(Math.min(position, tail.known));
      await waitFor(tail, state ? null : Math.max(1, appearBy - Date.now()), (w) => (wake = w));
      wake = null;
    }
  } finally {
    signal?.removeEventListener("abort", onAbort);
    tail.leave(cursor);
    tail.trim();
    fanout.detach(tail);
  }
}

/** Waits to be woken (new lines, an end, the tail's poll, an abort) or for `timeoutMs`. */
function waitFor(tail: JobTail, timeoutMs: number | null, setWake: (wake: () => void) => void): Promise<void> {
  return new Promise<void>((resolve) => {
    let timer: NodeJS.Timeout | null = null;
    const done = () => {
      if (timer) clearTimeout(timer);
      tail.waiting.delete(done);
      resolve();
    };
    tail.waiting.add(done);
    setWake(done);
    if (timeoutMs !== null) {
      timer = setTimeout(done, timeoutMs);
      timer.unref?.();
    }
  });
}

/** Lines for the next page, from the last page's average line size (16 … FOLLOW_PAGE). */
function nextPageLines(page: readonly StoredLine[]): number {
  let chars = 0;
  for (const line of page) chars += line.line.length + 16;
  const average = chars / page.length;
  return Math.max(16, Math.min(FOLLOW_PAGE, Math.floor(FOLLOW_PAGE_BYTES / average)));
}

/**
 * {@link followJob} with section events (`follow(id, { sections: true })`): each start and end comes right after its
 * marker's line. Seeded with the store's record as it stood before `from`, and folded with the stores' own rule
 * (log-sections.ts), so the events agree with `JobLogStore.sections`. O(1) a line without a marker; O(sections) once.
 */
export async function* followJobWithSections(
  core: RunnerCore,
  id: string,
  from: number,
  signal?: AbortSignal,
): AsyncGenerator<StoredLine | LogSectionEvent> {
  let record = sectionsBefore(core.logs.sections ? await core.logs.sections(id) : null, from);
  let position = from;
  const events: LogSectionEvent[] = [];
  for await (const line of followJob(core, id, from, signal)) {
    yield line;
    if (mayHoldMarker(line)) record = foldSections(record, [line], position, (event) => events.push(event))!;
    // A drop marker stands for itself and the positions after it that hold no line (log-tail.ts).
    position += 1 + (line.skipped ?? 0);
    for (const event of events) yield event;
    events.length = 0;
  }
}
