/**
 * Every live job's masker in the service, and the server-wide bound on what `::add-mask::` lines
 * make it hold: each job may register 8 MiB of forms (SERVICE_ADD_MASK_LIMITS), and all jobs
 * together `limits.addMaskFormBytes`, so a thousand hostile jobs cannot make the server hold
 * a thousand times a job's bound. Why: docs/decisions/log-masking.md, "The server-wide bound".
 */
import type { Buffer } from "node:buffer";
import type { MaskLimits } from "../masking/add-mask.js";
import { maskLine, maskLineBytes } from "../masking/add-mask.js";
import { jobMasker, type JobMasker } from "../masking/job-masker.js";
import { FORMS_REFUSAL } from "../masking/secret-masker.js";

/** What {@link JobMaskers.maskCommandText} or {@link JobMaskers.maskCommandBytes} did with a line. */
export interface Registered<T> {
  /** The masked line (bytes: null when unchanged). */
  readonly masked: T;
  /**
   * The job's first value refused for its forms while the server-wide bound left the job less room than its own
   * (later ones of the job are not told: one warning a job, not one a line).
   */
  readonly refusedUnderBudget: boolean;
}

/** A job's masker and its share of the server-wide bound. */
interface Held {
  job: JobMasker;
  /** Bytes of forms the job registered from `::add-mask::` lines (counted against the server-wide bound). */
  registered: number;
  /** Whether the job was told of a refusal the server-wide bound caused. */
  told: boolean;
}

/**
 * The service's maskers by request ID (in this process only, never in the store).
 *
 * @example
 * const maskers = new JobMaskers(256 * 1024 * 1024);
 * maskers.declare(requestId, ["s3cr3t-token"]);
 * maskers.get(requestId)?.masker.mask("uses s3cr3t-token"); // "uses ***"
 */
export class JobMaskers {
  private readonly jobs = new Map<string, Held>();
  /** Bytes of forms registered from `::add-mask::` lines, summed over the jobs held. */
  private used = 0;

  constructor(
    /** Most bytes of forms `::add-mask::` lines may register across all jobs held. */
    readonly maxRegisteredBytes: number,
  ) {}

  /** Bytes of forms registered from `::add-mask::` lines across the jobs held. O(1). */
  get registeredBytes(): number {
    return this.used;
  }

  /** Jobs held. O(1). */
  get size(): number {
    return this.jobs.size;
  }

  /** The job's masker, if it has one. O(1). */
  get(id: string): JobMasker | undefined {
    return this.jobs.get(id)?.job;
  }

  /**
   * Adds declared values to the job's masker (made when it has none). An `expectJob` called again keeps what the job
   * had and widens its own limits by the new values, so they do not use up what `::add-mask::` lines may still add;
   * declared values never count against the server-wide bound (the host gave them). O(their forms).
   */
  declare(id: string, secrets: readonly string[]): JobMasker {
    const held = this.jobs.get(id);
    if (held === undefined) {
      const job = jobMasker(secrets);
      this.jobs.set(id, { job, registered: 0, told: false });
      return job;
    }
    const old = held.job;
    const { size, valueBytes, formBytes } = old.masker;
    for (const value of secrets) old.masker.add(value);
    held.job = {
      masker: old.masker,
      limits: {
        values: old.limits.values + old.masker.size - size,
        valueBytes: old.limits.valueBytes + old.masker.valueBytes - valueBytes,
        formBytes: (old.limits.formBytes ?? Infinity) + old.masker.formBytes - formBytes,
      },
    };
    return held.job;
  }

  /**
   * Masks a line's text that may be a `::add-mask::` command, registering its value within the job's own limits and
   * what the server-wide bound has left; makes the job's masker when it has none. O(line + the value's forms).
   */
  maskCommandText(id: string, line: string): Registered<string> {
    return this.register(id, (masker, refused, limits) => maskLine(masker, line, refused, limits));
  }

  /** {@link JobMaskers.maskCommandText} over a line's bytes `[start, end)` of `buf` (null: unchanged). */
  maskCommandBytes(id: string, buf: Uint8Array, start: number, end: number): Registered<Buffer | null> {
    return this.register(id, (masker, refused, limits) => maskLineBytes(masker, buf, start, end, refused, limits));
  }

  /** Forgets the job's masker (its result is recorded) and gives back what it registered. O(1). */
  delete(id: string): void {
    const held = this.jobs.get(id);
    if (held === undefined) return;
    this.jobs.delete(id);
    this.used -= held.registered;
  }

  /** Runs `mask` with the job's masker under the limits left to it, and counts what it registered. */
  private register<T>(
    id: string,
    mask: (masker: JobMasker["masker"], refused: ((why: string) => void) | undefined, limits: MaskLimits) => T,
  ): Registered<T> {
    let held = this.jobs.get(id);
    if (held === undefined) this.jobs.set(id, (held = { job: jobMasker([]), registered: 0, told: false }));
    const { masker, limits: own } = held.job;
    const before = masker.formBytes;
    const ownForms = own.formBytes ?? Infinity;
    const left = before + Math.max(0, this.maxRegisteredBytes - this.used);
    const limits: MaskLimits = left < ownForms ? { ...own, formBytes: left } : own;
    let refusedUnderBudget = false;
    const refused =
      left < ownForms && !held.told
        ? (why: string) => (refusedUnderBudget ||= why.startsWith(FORMS_REFUSAL))
        : undefined;
    const masked = mask(masker, refused, limits);
    const added = masker.formBytes - before;
    held.registered += added;
    this.used += added;
    if (refusedUnderBudget) held.told = true;
    return { masked, refusedUnderBudget };
  }
}
