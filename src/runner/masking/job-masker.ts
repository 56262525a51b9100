/**
 * A job's masker as the service keeps it: its declared values, and how much `::add-mask::`
 * lines may still add (the service holds every job's masker, so what a job prints is bounded).
 */
import { createSecretMasker, type SecretMasker } from "./secret-masker.js";
import { SERVICE_ADD_MASK_LIMITS, type MaskLimits } from "./add-mask.js";

/** A job's masker in the service, and what `::add-mask::` lines may still add to it. */
export interface JobMasker {
  readonly masker: SecretMasker;
  /** The declared values (and their forms) plus {@link SERVICE_ADD_MASK_LIMITS}. */
  readonly limits: MaskLimits;
}

/**
 * A job's masker holding its declared values. O(their bytes).
 *
 * @example
 * const job = jobMasker(["s3cr3t-token"]);
 * job.masker.mask("uses s3cr3t-token"); // "uses ***"
 */
export function jobMasker(declared: readonly string[]): JobMasker {
  const masker = createSecretMasker(declared);
  return {
    masker,
    limits: {
      values: masker.size + SERVICE_ADD_MASK_LIMITS.values,
      valueBytes: masker.valueBytes + SERVICE_ADD_MASK_LIMITS.valueBytes,
      formBytes: masker.formBytes + SERVICE_ADD_MASK_LIMITS.formBytes!,
    },
  };
}
