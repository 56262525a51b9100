/** How the S3 adapters treat an endpoint that does not honour a ranged read. */

/**
 * Bytes a read skips at most when the endpoint served from before the asked start (it
 * ignored Range): a small object's tail still reads, a large one is refused instead of
 * being downloaded whole for its last bytes (an attack round, 2026-12-02: a 1-byte read
 * of a 64 MiB blob pulled all of it, every time).
 */
export const MAX_RANGE_SKIP = 1024 * 1024;
