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

/** What {@link JobMaskers.maskCommand} did with a line that may register a value. */
export interface Registered {
  /** The masked line: bytes (null: unchanged) or text. */
  readonly masked: Buffer | string | null;
  /**
   * The job's first value refused for its forms while the server-wide bound left the job less room than its own
   * (later ones of the job are not told: one warning a job, not one a line).
   */
  readonly refusedUnderBudget: boolean;
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
  private readonly jobs = new Map<string, JobMasker>();
  /** Bytes of forms each job registered from `::add-mask::` lines (counted against the server-wide bound). */
  private readonly registered = new Map<string, number>();
  /** Their sum over the jobs held. */
  private used = 0;
  /** Jobs told of a refusal the server-wide bound caused (at most the jobs held). */
  private readonly told = new Set<string>();

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
    return this.jobs.get(id);
  }

  /**
   * Adds declared values to the job's masker (made when it has none). An `expectJob` called again keeps what the job
   * had and widens its own limits by the new values, so they do not use up what `::add-mask::` lines may still add;
   * declared values never count against the server-wide bound (the host gave them). O(their forms).
   */
  declare(id: string, secrets: readonly string[]): JobMasker {
    const old = this.jobs.get(id);
    if (old === undefined) {
      const job = jobMasker(secrets);
      this.jobs.set(id, job);
      return job;
    }
    const { size, valueBytes, formBytes } = old.masker;
    for (const value of secrets) old.masker.add(value);
    const job: JobMasker = {
      masker: old.masker,
      limits: {
        values: old.limits.values + old.masker.size - size,
        valueBytes: old.limits.valueBytes + old.masker.valueBytes - valueBytes,
        formBytes: (old.limits.formBytes ?? Infinity) + old.masker.formBytes - formBytes,
      },
    };
    this.jobs.set(id, job);
    return job;
  }

  /**
   * Masks a line that may be a `::add-mask::` command (`line`: its text, or its bytes `[start, end)`), registering
   * its value within the job's own limits and what the server-wide bound has left; makes the job's masker when it has
   * none. O(line + the value's forms).
   */
  maskCommand(id: string, line: string | { buf: Uint8Array; start: number; end: number }): Registered {
    let job = this.jobs.get(id);
    if (job === undefined) this.jobs.set(id, (job = jobMasker([])));
    const before = job.masker.formBytes;
    const own = job.limits.formBytes ?? Infinity;
    const left = before + Math.max(0, this.maxRegisteredBytes - this.used);
    const limits: MaskLimits = left < own ? { ...job.limits, formBytes: left } : job.limits;
    let refusedUnderBudget = false;
    const refused =
      left < own && !this.told.has(id)
        ? (why: string) => (refusedUnderBudget ||= why.startsWith(FORMS_REFUSAL))
        : undefined;
    const masked =
      typeof line === "string"
        ? maskLine(job.masker, line, refused, limits)
        : maskLineBytes(job.masker, line.buf, line.start, line.end, refused, limits);
    const added = job.masker.formBytes - before;
    if (added > 0) {
      this.registered.set(id, (this.registered.get(id) ?? 0) + added);
      this.used += added;
    }
    if (refusedUnderBudget) this.told.add(id);
    return { masked, refusedUnderBudget };
  }

  /** Forgets the job's masker (its result is recorded) and gives back what it registered. O(1). */
  delete(id: string): void {
    this.jobs.delete(id);
    this.told.delete(id);
    const bytes = this.registered.get(id);
    if (bytes === undefined) return;
    this.registered.delete(id);
    this.used -= bytes;
  }
}
