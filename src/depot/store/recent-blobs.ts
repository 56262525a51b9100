/**
 * The bytes of small blobs a composed store wrote or read lately (small-blob-tier.ts), kept in memory for reads:
 * a commit reads the blob its addition just wrote (to hash the archive) and again after its answer, and both are
 * hits in the process that took the addition.
 * Why: docs/decisions/depot-scale-out.md, "Small blobs in PostgreSQL" (recent bytes in memory).
 */

/**
 * Bytes charged per entry beside its own: the Map entry, the digest's 71-character string and the typed array's
 * object. Charged so that many tiny blobs (one byte each) cannot hold far more memory than the capacity says.
 */
const ENTRY_BYTES = 256;

interface Entry {
  data: Uint8Array;
  /** When the bytes were last seen in the table (put, or read from it). */
  at: number;
}

/**
 * Least recently used out first, at most `capacity` bytes charged (each entry its bytes + {@link ENTRY_BYTES}).
 * Content-addressed bytes never change, but a blob can be deleted: by this process ({@link delete}, which also
 * stops a read or put that started before it from caching what it saw: pass {@link mark}'s value to {@link put}),
 * or by another replica, which this one cannot see: an entry is therefore served for at most `maxAgeMs` after its
 * bytes were last seen in the table, then read there again. O(1) a get, put or delete.
 *
 * @example
 * const recent = new RecentBlobs(4 * 1024 * 1024, 5_000);
 * const mark = recent.mark();
 * const data = await small.getSmallBlob(digest);
 * if (data) recent.put(digest, data, mark);
 */
export class RecentBlobs {
  private readonly entries = new Map<string, Entry>();
  private bytes = 0;
  /** Deletes so far: a put marked before one may be about bytes that delete removed. */
  private deletes = 0;

  constructor(
    private readonly capacity: number,
    private readonly maxAgeMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  /** Entries held. */
  get size(): number {
    return this.entries.size;
  }

  /** Taken before the table is asked: {@link put} then caches only if no delete came in between. */
  mark(): number {
    return this.deletes;
  }

  /** The bytes, unless absent or seen in the table longer than `maxAgeMs` ago (then dropped). */
  get(digest: string): Uint8Array | undefined {
    const entry = this.entries.get(digest);
    if (!entry) return undefined;
    this.entries.delete(digest);
    if (this.now() - entry.at > this.maxAgeMs) {
      this.bytes -= entry.data.byteLength + ENTRY_BYTES;
      return undefined;
    }
    this.entries.set(digest, entry);
    return entry.data;
  }

  /** Keeps `data` (seen in the table since `mark` was taken), evicting the least recently used past capacity. */
  put(digest: string, data: Uint8Array, mark: number): void {
    const cost = data.byteLength + ENTRY_BYTES;
    if (mark !== this.deletes || cost > this.capacity || this.entries.has(digest)) return;
    // A copy unless `data` is its whole buffer: a view into Node's shared 8 KiB pool (pg's bytea under 4 KiB,
    // Buffer.concat) would pin the whole slab for a few bytes.
    const own = data.byteOffset === 0 && data.buffer.byteLength === data.byteLength ? data : new Uint8Array(data);
    this.entries.set(digest, { data: own, at: this.now() });
    this.bytes += cost;
    for (const [oldest, old] of this.entries) {
      if (this.bytes <= this.capacity) break;
      this.entries.delete(oldest);
      this.bytes -= old.data.byteLength + ENTRY_BYTES;
    }
  }

  /** Forgets `digest`, and makes every put marked before now a no-op. */
  delete(digest: string): void {
    this.deletes++;
    const entry = this.entries.get(digest);
    if (!entry) return;
    this.entries.delete(digest);
    this.bytes -= entry.data.byteLength + ENTRY_BYTES;
  }
}
