/**
 * Full-size line blocks the memory store let go (of pruned or archived jobs, and dropped tail segments), kept for
 * the next lines.
 *
 * Why: a job's lines land in new 1 MiB blocks, and first touching new memory (page faults, V8's external-memory
 * collections) was the largest single cost of a server that keeps every line (docs/decisions/ingest-limit.md,
 * "The memory store's block pool"). A long-running server prunes ended jobs as new ones arrive; their blocks are
 * already touched. The pool holds at most `capacity` blocks, so a store holds at most that much more than its jobs.
 */
export class BlockPool {
  private readonly spare: Buffer[] = [];

  /**
   * @param blockSize the only size pooled (the store's largest block; smaller ones are a job's first few).
   * @param capacity most blocks held.
   */
  constructor(
    readonly blockSize: number,
    readonly capacity: number,
  ) {}

  /** Blocks held now. */
  get size(): number {
    return this.spare.length;
  }

  /**
   * A block of `blockSize` bytes: a pooled one when there is one (zeroed when it was given back), else a new one
   * (`Buffer.allocUnsafe`: whatever the process's memory held). O(1).
   */
  take(): Buffer {
    return this.spare.pop() ?? Buffer.allocUnsafe(this.blockSize);
  }

  /**
   * Gives back blocks no job reads any more. Each kept one is zeroed first: a read past a line's end (a bug; reads
   * stop at each line's end) could then show no let-go job's lines, though a new block can still hold any of the
   * process's old memory. Blocks of another size, and any past the capacity, are left to the GC. O(bytes given back).
   */
  give(blocks: readonly Buffer[]): void {
    for (const block of blocks) {
      if (this.spare.length >= this.capacity) return;
      // Given twice, a block would serve two jobs at once: O(pooled) to refuse it, at most `capacity`.
      if (block.length !== this.blockSize || this.spare.includes(block)) continue;
      this.spare.push(block.fill(0));
    }
  }

  /** Lets every pooled block go to the GC (the store is closed). O(1). */
  clear(): void {
    this.spare.length = 0;
  }
}
