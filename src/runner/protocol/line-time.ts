/**
 * A log line's time (docs/runner-protocol.md §2, "Line times"): on the wire `LogChunk.time_unix_nano`
 * (fixed64, nanoseconds since the Unix epoch, 0 = no stamp); in this package a number of
 * milliseconds since the epoch kept to the microsecond (an integer count of µs ÷ 1000), so
 * it compares with `Date.now()` and every store round-trips it exactly (a double keeps ms to
 * the µs below 2^42 ms, the year 2109; past it, to about a µs). 0 means "no time".
 * Why: docs/decisions/log-line-time.md.
 */

const TWO_32 = 2 ** 32;
/**
 * Latest time kept, in µs (2^52 - 1: September 2112); a later stamp is kept as this. Below it every
 * µs count, every difference of two and its zigzag form are exact integers in a double, which the
 * stores' formats rely on (docs/decisions/log-line-time.md, "A hostile agent's times").
 */
export const MAX_MICROS = 2 ** 52 - 1;

/** A time in ms rounded to the microsecond, as an integer count of µs (0 for none, negative or not finite). O(1). */
export function toMicros(ms: number): number {
  if (!(ms > 0)) return 0;
  const us = Math.round(ms * 1000);
  return us > MAX_MICROS ? MAX_MICROS : us;
}

/** The canonical ms value of an integer count of µs (what every reader yields). O(1). */
export function fromMicros(us: number): number {
  return us / 1000;
}

/** A time in ms as the package keeps it (rounded to the µs; 0 for none). O(1). */
export function lineTime(ms: number): number {
  return fromMicros(toMicros(ms));
}

/** The agent's clock, in ms to the microsecond (the wall clock plus the monotonic clock's fraction). O(1). */
export function nowMs(): number {
  return lineTime(performance.timeOrigin + performance.now());
}

/** Writes `ms` as the 8 little-endian bytes of its nanoseconds (fixed64) at `pos`; returns pos + 8. O(1). */
export function writeNanos(buf: Uint8Array, pos: number, ms: number): number {
  const us = toMicros(ms);
  const usHi = Math.floor(us / TWO_32);
  const loProduct = (us - usHi * TWO_32) * 1000; // < 2^42: exact
  const lo = loProduct % TWO_32;
  const hi = usHi * 1000 + Math.floor(loProduct / TWO_32);
  buf[pos] = lo & 0xff;
  buf[pos + 1] = (lo >>> 8) & 0xff;
  buf[pos + 2] = (lo >>> 16) & 0xff;
  buf[pos + 3] = lo >>> 24;
  buf[pos + 4] = hi & 0xff;
  buf[pos + 5] = (hi >>> 8) & 0xff;
  buf[pos + 6] = (hi >>> 16) & 0xff;
  buf[pos + 7] = hi >>> 24;
  return pos + 8;
}

/** Reads 8 little-endian bytes of nanoseconds at `pos` as ms to the µs (below 1 µs: 0, no time). O(1). */
export function readNanos(buf: Uint8Array, pos: number): number {
  const lo = (buf[pos]! | (buf[pos + 1]! << 8) | (buf[pos + 2]! << 16)) + buf[pos + 3]! * 0x1000000;
  const hi = (buf[pos + 4]! | (buf[pos + 5]! << 8) | (buf[pos + 6]! << 16)) + buf[pos + 7]! * 0x1000000;
  // floor((hi·2^32 + lo) / 1000) without leaving the exact range of a double.
  const q = Math.floor(hi / 1000);
  const r = hi - q * 1000;
  return fromMicros(Math.min(MAX_MICROS, q * TWO_32 + Math.floor((r * TWO_32 + lo) / 1000)));
}

/** Nanoseconds (the protobuf-es field) as ms to the µs. O(1). */
export function nanosToMs(nanos: bigint): number {
  if (nanos <= 0n) return 0;
  const us = nanos / 1000n;
  return fromMicros(us > BigInt(MAX_MICROS) ? MAX_MICROS : Number(us));
}

/** ms to the µs as nanoseconds (the protobuf-es field; 0n for none). O(1). */
export function msToNanos(ms: number): bigint {
  return BigInt(toMicros(ms)) * 1000n;
}

/**
 * RFC 3339 UTC with six fractional digits (GitLab's per-line form), e.g. `2025-11-29T08:30:00.123456Z`.
 * O(1).
 *
 * @example
 * rfc3339Micro(1764405000123.456); // "2025-11-29T08:30:00.123456Z"
 */
export function rfc3339Micro(ms: number): string {
  const us = toMicros(ms);
  const whole = Math.floor(us / 1000);
  const iso = new Date(whole).toISOString(); // …T08:30:00.123Z
  return `${iso.slice(0, 23)}${String(us % 1000).padStart(3, "0")}Z`;
}
