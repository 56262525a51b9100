/**
 * Splits a request body into length-prefixed envelopes (gRPC, gRPC-web and Connect
 * streaming share the format: 1 flag byte, a 4-byte big-endian length, the message).
 * Why: docs/decisions/runner-server.md, "envelope-splitter.ts: why not connect's envelope reader".
 */

/** Bytes of an envelope prefix: flags (1) and length (4). */
export const ENVELOPE_PREFIX = 5;

/** Thrown by {@link EnvelopeSplitter.push} when a prefix announces more than its limit. */
export class EnvelopeTooLarge extends Error {
  constructor(
    /** Announced message size. */
    readonly size: number,
    /** The limit that applied. */
    readonly limit: number,
    /** Index of the envelope in the body (0: the first). */
    readonly index: number,
  ) {
    super(`envelope ${index} announces ${size} bytes, over the ${limit}-byte limit`);
  }
}

/** Receives one whole envelope, prefix included: `buf[start, end)`; `buf` may be reused after the call returns. */
type EnvelopeCallback = (buf: Buffer, start: number, end: number) => void;

/** Smallest buffer for an envelope spread over chunks (so one-byte chunks do not realloc every byte). */
const MIN_HOLD = 256;

/**
 * A body's envelope splitter. Limits are checked on each prefix before its message is
 * buffered: `firstMaxBytes` for the first envelope, `maxBytes` for the others.
 *
 * @example
 * const splitter = new EnvelopeSplitter(64 * 1024, 1024 * 1024);
 * req.on("data", (chunk) => splitter.push(chunk, (buf, start, end) => handle(buf.subarray(start + 5, end))));
 * req.on("end", () => { if (splitter.heldBytes > 0) throw new Error("incomplete envelope"); });
 */
export class EnvelopeSplitter {
  /** Envelopes whose prefix has been read (complete or in progress). */
  private prefixes = 0;
  private emitted = 0;
  private held: Buffer | null = null;
  private heldLen = 0;
  /** Total bytes of the envelope in progress (prefix + message) once its prefix is known; 0 before. */
  private need = 0;

  constructor(
    /** Largest message of the first envelope. */
    public firstMaxBytes: number,
    /** Largest message of every later envelope. */
    public maxBytes: number,
  ) {}

  /** Bytes of an incomplete envelope held until the rest arrives. */
  get heldBytes(): number {
    return this.heldLen;
  }

  /** Size of the buffer behind {@link heldBytes} (at most twice the bytes held, or 256). */
  get heldCapacity(): number {
    return this.held?.length ?? 0;
  }

  /** Envelopes completed so far. */
  get completed(): number {
    return this.emitted;
  }

  /**
   * Feeds one chunk; calls `emit` for every envelope it completes, in order. Throws
   * EnvelopeTooLarge on an oversized prefix, after emitting the envelopes before it.
   * O(chunk length) plus the copy of the bytes it adds to a held envelope.
   */
  push(chunk: Buffer, emit: EnvelopeCallback): void {
    let pos = 0;
    const len = chunk.length;
    if (this.heldLen > 0) {
      pos = this.fill(chunk, emit);
      if (this.heldLen > 0) return;
    }
    while (len - pos >= ENVELOPE_PREFIX) {
      const size = chunk.readUInt32BE(pos + 1);
      this.check(size);
      const stop = pos + ENVELOPE_PREFIX + size;
      if (stop > len) {
        this.need = ENVELOPE_PREFIX + size;
        break;
      }
      this.emitted++;
      emit(chunk, pos, stop);
      pos = stop;
    }
    if (pos < len) this.hold(chunk, pos, len);
    else this.need = 0;
  }

  /** Drops whatever is held (the body will not be read on). */
  reset(): void {
    this.held = null;
    this.heldLen = 0;
    this.need = 0;
  }

  private check(size: number): void {
    const index = this.prefixes++;
    const limit = index === 0 ? this.firstMaxBytes : this.maxBytes;
    if (size > limit) {
      this.reset();
      throw new EnvelopeTooLarge(size, limit, index);
    }
  }

  /** Starts holding `chunk[from, to)`: an incomplete envelope (its prefix may be incomplete too). */
  private hold(chunk: Buffer, from: number, to: number): void {
    const n = to - from;
    const want = this.need > 0 ? Math.min(this.need, Math.max(MIN_HOLD, 2 * n)) : Math.max(MIN_HOLD, n);
    // allocUnsafeSlow: a buffer of its own. Under 4 KiB allocUnsafe hands out a slice of
    // Node's shared 8 KiB pool, and a line kept as bytes of the emitted envelope
    // (runner/protocol/received-line.ts) would keep that whole slab alive until it is stored.
    this.held = Buffer.allocUnsafeSlow(want);
    chunk.copy(this.held, 0, from, to);
    this.heldLen = n;
  }

  /** Adds to the held envelope; returns where the chunk goes on (chunk.length when all was taken). */
  private fill(chunk: Buffer, emit: EnvelopeCallback): number {
    let pos = 0;
    if (this.need === 0) {
      // The prefix itself was cut: complete it first.
      const take = Math.min(ENVELOPE_PREFIX - this.heldLen, chunk.length);
      this.append(chunk, 0, take);
      pos = take;
      if (this.heldLen < ENVELOPE_PREFIX) return pos;
      const size = this.held!.readUInt32BE(1);
      this.check(size);
      this.need = ENVELOPE_PREFIX + size;
    }
    const take = Math.min(this.need - this.heldLen, chunk.length - pos);
    this.append(chunk, pos, pos + take);
    pos += take;
    if (this.heldLen === this.need) {
      const whole = this.held!;
      const stop = this.need;
      this.held = null;
      this.heldLen = 0;
      this.need = 0;
      this.emitted++;
      emit(whole, 0, stop);
    }
    return pos;
  }

  private append(chunk: Buffer, from: number, to: number): void {
    const n = to - from;
    if (n === 0) return;
    let held = this.held!;
    if (this.heldLen + n > held.length) {
      // Grow by doubling (amortised O(1) per byte), never past the envelope's own size.
      const target = Math.max(this.heldLen + n, 2 * held.length);
      const grown = Buffer.allocUnsafeSlow(this.need > 0 ? Math.min(this.need, target) : target);
      held.copy(grown, 0, 0, this.heldLen);
      held = this.held = grown;
    }
    chunk.copy(held, this.heldLen, from, to);
    this.heldLen += n;
  }
}
