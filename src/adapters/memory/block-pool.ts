/**
 * Full-size line blocks of jobs the memory store let go (pruned or archived), kept for the next jobs' lines.
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

  /** A block of `blockSize` bytes: a pooled one when there is one (its bytes zero), else a new one. O(1). */
  take(): Buffer {
    return this.spare.pop() ?? Buffer.allocUnsafe(this.blockSize);
  }

  /**
   * Gives back blocks no job reads any more. Each kept one is zeroed first, so no later bug reading past a line's
   * end could show a let-go job's lines; blocks of another size, and any past the capacity, are left to the GC.
   * O(bytes given back).
   */
  give(blocks: readonly Buffer[]): void {
    for (const block of blocks) {
      if (this.spare.length >= this.capacity) return;
      if (block.length !== this.blockSize) continue;
      this.spare.push(block.fill(0));
    }
  }
}
