/**
 * Log archiving (docs/decisions/log-archive.md): a JobLogStore that moves each ended job's lines from the
 * live store (PostgreSQL, fs) into one compressed, indexed object in a {@link LogArchiveStore} (S3, a
 * directory) and reads them back from there, so the live store holds the lines of live jobs only while
 * `read`, `follow()` and the console see no difference.
 * Why: docs/decisions/log-archive.md, "archiving-store.ts: moving ended logs to the archive".
 */
import { RunnerDepotError } from "../../errors.js";
import { ArchiveWriter, chunkOf, decodeChunk, decodeIndex, tailBytes, type ArchiveIndex } from "./format.js";
import type { ArchivedLog, JobLogStore, JobState, LogArchiveStore, StoredLine } from "../ports.js";
import { isMarkedReadsLineEntries, readsLineEntries } from "../protocol/received-line.js";
import { positionAfter, readKept } from "../service/log-tail.js";
import { pageBudget, type PageBudget } from "../service/page-budget.js";
import { cloneCut } from "../service/job-state.js";

/** Options of {@link createArchivingLogStore}. */
export interface LogArchiveOptions {
  /** Where archived logs go. */
  archive: LogArchiveStore;
  /**
   * Live-store retention of an ended job's lines: they move to the archive this long after
   * the job's end; default 0 (at its end). The job's state stays in the live store until
   * the service's `retentionMs` forgets the job, and its archive goes with it.
   */
  keepLiveMs?: number;
  /**
   * Archive retention: objects older than this are deleted even while their job is kept
   * (its lines then read as none); default false (an object lives as long as its job).
   */
  archiveRetentionMs?: number | false;
  /** How often jobs whose archiving was missed (a replica that stopped) are looked for; default 60 000. */
  sweepIntervalMs?: number;
  /** Jobs archived per sweep at most; default 100. */
  sweepBatch?: number;
  /** How often `prune` also prunes the archive (a listing, O(objects)); default 3 600 000. */
  archivePruneIntervalMs?: number;
  /** gzip level of the chunks (1 fastest … 9 smallest); default 6. */
  level?: number;
  /** Memory for archive indexes and inflated chunks kept for readers; default 32 MiB. */
  cacheBytes?: number;
  /** Failures of background archiving (the job stays in the live store and is retried). */
  onError?: (error: unknown) => void;
}

/** A live store that also archives, with the archive's own controls. */
export interface ArchivingLogStore extends JobLogStore {
  /** Moves an ended job's lines to the archive now; resolves with its state (unchanged when open or unknown). */
  archiveJob(requestId: string): Promise<JobState | null>;
  /** The live store underneath. */
  readonly live: JobLogStore;
  /** Stops the sweep, waits for archiving in progress, closes the live store and the archive. */
  close(): Promise<void>;
}

/** The object key of a job's archive. */
export function archiveKey(requestId: string): string {
  return `${requestId}.rdlog`;
}

/**
 * Bytes of line text read from the live store per page while archiving.
 * Why: docs/decisions/log-archive.md, "archiving-store.ts: ARCHIVE_PAGE_BYTES".
 */
const ARCHIVE_PAGE_BYTES = 4 * 1024 * 1024;
const ARCHIVE_PAGE_MIN = 64;
const ARCHIVE_PAGE_MAX = 16_384;

/** Lines for the next page, aiming at ARCHIVE_PAGE_BYTES from `bytes` seen over `lines`. */
function pageLines(bytes: number, lines: number): number {
  const perLine = lines > 0 ? Math.max(1, bytes / lines) : 256;
  return Math.max(ARCHIVE_PAGE_MIN, Math.min(ARCHIVE_PAGE_MAX, Math.floor(ARCHIVE_PAGE_BYTES / perLine)));
}

/** A byte-bounded least-recently-used cache (Map keeps insertion order). */
class Lru<V> {
  private readonly map = new Map<string, { value: V; size: number }>();
  private bytes = 0;
  constructor(private readonly capacity: number) {}
  get(key: string): V | undefined {
    const hit = this.map.get(key);
    if (!hit) return undefined;
    this.map.delete(key);
    this.map.set(key, hit);
    return hit.value;
  }
  set(key: string, value: V, size: number): void {
    this.delete(key);
    if (size > this.capacity) return;
    this.map.set(key, { value, size });
    this.bytes += size;
    for (const [k, v] of this.map) {
      if (this.bytes <= this.capacity) break;
      this.map.delete(k);
      this.bytes -= v.size;
    }
  }
  delete(key: string): void {
    const hit = this.map.get(key);
    if (!hit) return;
    this.map.delete(key);
    this.bytes -= hit.size;
  }
}

/**
 * Wraps a live JobLogStore so ended jobs' logs move to `options.archive` and are read from
 * there. The live store must implement `markArchived` (and, for the sweep of missed jobs,
 * `archivable`); the memory, fs and PostgreSQL stores do.
 *
 * @example
 * const logs = createArchivingLogStore(createPostgresLogStore({ connectionString }), {
 *   archive: createS3LogArchive({ bucket: "ci-logs", prefix: "jobs/" }),
 *   keepLiveMs: 0,
 * });
 * const runner = createRunnerService(queue, { logs });
 */
export function createArchivingLogStore(live: JobLogStore, options: LogArchiveOptions): ArchivingLogStore {
  if (!live.markArchived) throw new RangeError("createArchivingLogStore: the live store has no markArchived");
  const markArchived: NonNullable<JobLogStore["markArchived"]> = live.markArchived.bind(live);
  const { archive } = options;
  const keepLiveMs = options.keepLiveMs ?? 0;
  const level = options.level ?? 6;
  const cacheBytes = options.cacheBytes ?? 32 * 1024 * 1024;
  // Indexes and inflated chunks share the budget; a chunk is about 256 KiB of records.
  const indexes = new Lru<ArchiveIndex>(Math.floor(cacheBytes / 4));
  const chunks = new Lru<StoredLine[]>(Math.floor((cacheBytes * 3) / 4));
  /** Chunk reads under way, by `${id}:${chunk}`. */
  const decoding = new Map<string, Promise<StoredLine[] | null>>();
  /** Jobs known to be archived (immutable once set): reads skip the live store. */
  const archived = new Lru<ArchivedLog>(65_536);
  const inFlight = new Map<string, Promise<JobState | null>>();
  const background = new Set<Promise<unknown>>();
  let lastArchivePrune = 0;
  let closed = false;

  const report = (error: unknown) => {
    try {
      options.onError?.(error);
    } catch {
      // A broken hook must not break the store.
    }
  };

  function track(p: Promise<unknown>) {
    background.add(p);
    void p.catch(report).finally(() => background.delete(p));
  }

  /** Index of a job's archive: one Range read of the object's last bytes, then cached. */
  async function indexOf(id: string, info: ArchivedLog): Promise<ArchiveIndex | null> {
    const cached = indexes.get(id);
    if (cached) return cached;
    const size = tailBytes(info.chunks);
    const tail = await archive.read(archiveKey(id), info.bytes - size, info.bytes);
    if (!tail) return null;
    const index = decodeIndex(tail, info.bytes);
    indexes.set(id, index, index.offsets.length * 16 + 64);
    return index;
  }

  /**
   * Lines of chunk `c`: one Range read of its compressed bytes, inflated and cached.
   * Concurrent readers of the same chunk share one read and one decode.
   */
  function chunkLines(id: string, index: ArchiveIndex, c: number): Promise<StoredLine[] | null> {
    const key = `${id}:${c}`;
    const cached = chunks.get(key);
    if (cached) return Promise.resolve(cached);
    let pending = decoding.get(key);
    if (!pending) {
      pending = loadChunk(key, id, index, c).finally(() => decoding.delete(key));
      decoding.set(key, pending);
    }
    return pending;
  }

  async function loadChunk(key: string, id: string, index: ArchiveIndex, c: number): Promise<StoredLine[] | null> {
    const packed = await archive.read(archiveKey(id), index.offsets[c]!, index.offsets[c + 1]!);
    if (!packed) return null;
    const lines = await decodeChunk(packed, index.firsts[c + 1]! - index.firsts[c]!, index.version);
    let size = 0;
    for (const line of lines) size += line.line.length * 2 + 48;
    chunks.set(key, lines, size);
    return lines;
  }

  /** The error for a job whose object is gone: never an empty log, which would read as a job that printed nothing. */
  function archiveGone(id: string): RunnerDepotError {
    return new RunnerDepotError(
      "LOG_ARCHIVE_GONE",
      `The log of job ${id} was archived, and its archive object ${archiveKey(id)} is gone (archive retention or a deletion)`,
    );
  }

  /**
   * Lines from an archive by position: a cut log's object holds head, marker and tail back to back, so positions
   * past the dropped range map to `position − cut.lines` (log-tail.ts). O(log chunks + lines read).
   */
  function readArchived(
    id: string,
    info: ArchivedLog,
    from: number,
    limit: number,
    budget: PageBudget,
  ): Promise<StoredLine[]> {
    const cut = info.cut;
    if (!cut) return readObject(id, info, from, limit, budget);
    const positions = { storedLines: info.lines + cut.lines, cut };
    return readKept(
      positions,
      from,
      limit,
      (a, b) => {
        const shift = a < cut.at ? 0 : cut.lines;
        return readObject(id, info, a - shift, b - a, budget);
      },
      budget,
    );
  }

  /**
   * Lines `[from, from + limit)` of the object within `budget`: O(log chunks) to find the first, then a chunk at a
   * time (a chunk's lines are held once decoded, whatever the budget: ≤ 256 KiB of records).
   */
  async function readObject(
    id: string,
    info: ArchivedLog,
    from: number,
    limit: number,
    budget: PageBudget,
  ): Promise<StoredLine[]> {
    const out: StoredLine[] = [];
    if (from >= info.lines || limit <= 0) return out;
    const index = await indexOf(id, info);
    if (!index) throw archiveGone(id);
    let position = from;
    while (out.length < limit && position < index.lines) {
      const c = chunkOf(index, position);
      const lines = await chunkLines(id, index, c);
      if (!lines) throw archiveGone(id);
      const start = position - index.firsts[c]!;
      const take = Math.min(lines.length - start, limit - out.length);
      for (let i = 0; i < take; i++) {
        const line = lines[start + i]!;
        if (!budget.take(line.line.length)) return out;
        out.push({ ...line });
      }
      position += take;
    }
    return out;
  }

  async function doArchive(id: string): Promise<JobState | null> {
    const state = await live.get(id);
    if (!state || state.status === "open" || state.archived) return state;
    const total = state.storedLines;
    const cut = state.cut;
    const writer = new ArchiveWriter(level);
    let bytes = 0;
    async function* body(): AsyncGenerator<Uint8Array> {
      let position = 0;
      // A page holds at most ARCHIVE_PAGE_MAX lines, and ARCHIVE_PAGE_BYTES (the store ends it there: short lines
      // seen so far do not make a page of long ones 16,384 × 64 KiB); its size follows the bytes seen so far.
      let pageSize = pageLines(state!.storedBytes, total);
      while (position < total) {
        const limit = Math.min(pageSize, total - position);
        let pageBytes = 0;
        // A store that keeps bytes hands them over as they are (no string per line, no
        // re-encoding); the records and the object are the same either way.
        const closed: Promise<Buffer>[] = [];
        let count: number;
        let lastPage: StoredLine[] = [];
        // A cut log is read as lines: the store makes its marker's text from the final counts.
        if (live.readRaw && !cut) {
          const page = await live.readRaw(id, position, limit, { maxBytes: ARCHIVE_PAGE_BYTES });
          count = page.count;
          page.each((text, start, end, flags, time) => {
            pageBytes += end - start;
            const chunk = writer.addBytes(text, start, end, flags, time);
            if (chunk) closed.push(chunk);
          });
        } else {
          const page = await live.read(id, position, limit, { maxBytes: ARCHIVE_PAGE_BYTES });
          lastPage = page;
          count = page.length;
          for (const line of page) {
            const text = Buffer.from(line.line, "utf8");
            pageBytes += text.length;
            const flags = (line.stderr ? 1 : 0) | (line.marker ? 2 : 0) | (line.serverTime ? 4 : 0);
            const chunk = writer.addBytes(text, 0, text.length, flags, line.time ?? 0);
            if (chunk) closed.push(chunk);
          }
        }
        // Another replica archived it meanwhile (its lines are gone): write nothing.
        if (count === 0) throw new RunnerDepotError("ABORTED", `job ${id}: lines vanished while archiving`);
        // At most a page's bytes ÷ 256 KiB chunks are compressed at once (each on the thread pool).
        for (const pending of closed) {
          const chunk = await pending;
          bytes += chunk.length;
          yield chunk;
        }
        position = cut ? positionAfter(position, lastPage) : position + count;
        pageSize = pageLines(pageBytes, count);
      }
      for (const part of await writer.finish()) {
        bytes += part.length;
        yield part;
      }
    }
    try {
      await archive.put(archiveKey(id), body());
    } catch (error) {
      if (error instanceof RunnerDepotError && error.code === "ABORTED") return live.get(id);
      throw error;
    }
    const info: ArchivedLog = {
      lines: writer.lines,
      bytes,
      chunks: writer.chunks,
      rawBytes: writer.rawBytes,
      at: new Date().toISOString(),
    };
    if (cut) info.cut = cloneCut(cut);
    const after = await markArchived(id, info);
    if (after?.archived) archived.set(id, after.archived, 1);
    return after;
  }

  function archiveJob(requestId: string): Promise<JobState | null> {
    let running = inFlight.get(requestId);
    if (!running) {
      running = doArchive(requestId).finally(() => inFlight.delete(requestId));
      inFlight.set(requestId, running);
    }
    return running;
  }

  /** Archives what the end-of-job trigger missed (a replica that stopped, keepLiveMs > 0). */
  async function sweep(): Promise<void> {
    if (!live.archivable || closed) return;
    const due = await live.archivable(new Date(Date.now() - keepLiveMs), options.sweepBatch ?? 100);
    for (const state of due) {
      if (closed) return;
      await archiveJob(state.requestId).catch(report);
    }
  }

  let sweeping = false;
  const timer = setInterval(() => {
    if (sweeping) return;
    sweeping = true;
    track(sweep().finally(() => (sweeping = false)));
  }, options.sweepIntervalMs ?? 60_000);
  timer.unref?.();

  const store: ArchivingLogStore = {
    live,
    archiveJob,
    open: (id, o) => live.open(id, o),
    get: (id) => live.get(id),
    append: (id, at, entries, now) => live.append(id, at, entries, now),
    async finish(id, result, finishOptions) {
      const out = await live.finish(id, result, finishOptions);
      // The replica that recorded the end archives it; the sweep covers one that stopped.
      if (out.first && keepLiveMs === 0 && !closed) track(archiveJob(id));
      return out;
    },
    async read(id, from = 0, limit = Number.MAX_SAFE_INTEGER, options) {
      const known = archived.get(id);
      if (known) return readArchived(id, known, from, limit, pageBudget(options));
      const lines = await live.read(id, from, limit, options);
      if (lines.length > 0 || limit <= 0) return lines;
      // Nothing here: the lines may have moved (markArchived drops them atomically).
      const state = await live.get(id);
      if (!state?.archived) return lines;
      archived.set(id, state.archived, 1);
      return readArchived(id, state.archived, from, limit, pageBudget(options));
    },
    // Sections stay in the live store when the lines move (markArchived keeps them): O(sections).
    sections: live.sections ? (id) => live.sections!(id) : undefined,
    // An archived job's lines are not in the live store: null sends the search to `read` (the archive).
    findLines: live.findLines
      ? async (id, needle, from, limits) => (archived.get(id) ? null : live.findLines!(id, needle, from, limits))
      : undefined,
    stale: (before) => live.stale(before),
    archivable: live.archivable ? (before, limit) => live.archivable!(before, limit) : undefined,
    markArchived,
    watch: live.watch ? (listener) => live.watch!(listener) : undefined,
    list: live.list ? (query) => live.list!(query) : undefined,
    async prune(before) {
      // Archives first: an object outliving its job's state would be unreachable.
      const now = Date.now();
      if (archive.prune && now - lastArchivePrune >= (options.archivePruneIntervalMs ?? 3_600_000)) {
        lastArchivePrune = now;
        const retention = options.archiveRetentionMs;
        const cutoff =
          retention === undefined || retention === false
            ? before
            : new Date(Math.max(before.getTime(), now - retention));
        await archive.prune(cutoff);
      }
      return live.prune ? live.prune(before) : 0;
    },
    async close() {
      if (closed) return;
      closed = true;
      clearInterval(timer);
      await Promise.allSettled([...background]);
      await live.close?.();
      await archive.close?.();
    },
  };
  // append hands entries through unchanged: the live store's mark holds for this one too.
  if (isMarkedReadsLineEntries(live)) readsLineEntries(store);
  return store;
}
