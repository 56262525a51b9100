/**
 * The one error type of runner-depot. Every failure carries a `code`; the runner maps
 * it to a gRPC status and the depot to an RFC 9457 problem, from the same table.
 */
import { Code, ConnectError } from "@connectrpc/connect";

/** Where a code lands on each interface: gRPC status code and HTTP status. */
const CODES = {
  // gRPC-flavoured codes (runner protocol).
  INVALID_ARGUMENT: [Code.InvalidArgument, 400],
  UNAUTHENTICATED: [Code.Unauthenticated, 401],
  PERMISSION_DENIED: [Code.PermissionDenied, 403],
  NOT_FOUND: [Code.NotFound, 404],
  FAILED_PRECONDITION: [Code.FailedPrecondition, 409],
  ABORTED: [Code.Aborted, 409],
  RESOURCE_EXHAUSTED: [Code.ResourceExhausted, 413],
  UNAVAILABLE: [Code.Unavailable, 503],
  DEADLINE_EXCEEDED: [Code.DeadlineExceeded, 504],
  // A request the server does not support (e.g. an unknown grpc-encoding).
  UNIMPLEMENTED: [Code.Unimplemented, 501],
  INTERNAL: [Code.Internal, 500],
  // Depot codes (docs/depot-api.md, §10).
  BAD_REQUEST: [Code.InvalidArgument, 400],
  NAME_INVALID: [Code.InvalidArgument, 400],
  VERSION_INVALID: [Code.InvalidArgument, 400],
  RANGE_INVALID: [Code.InvalidArgument, 400],
  PATH_INVALID: [Code.InvalidArgument, 400],
  HEADER_INVALID: [Code.InvalidArgument, 400],
  TYPE_INVALID: [Code.InvalidArgument, 400],
  DIGEST_MISMATCH: [Code.InvalidArgument, 400],
  VERSION_NOT_FOUND: [Code.NotFound, 404],
  PACKAGE_NOT_FOUND: [Code.NotFound, 404],
  TRANSACTION_NOT_FOUND: [Code.NotFound, 404],
  VERSION_EXISTS: [Code.AlreadyExists, 409],
  PATH_EXISTS: [Code.AlreadyExists, 409],
  DIGEST_UNKNOWN: [Code.FailedPrecondition, 409],
  CONFLICT: [Code.Aborted, 409],
  TRANSACTION_EXPIRED: [Code.FailedPrecondition, 410],
  TRANSACTION_GONE: [Code.FailedPrecondition, 410],
  TRANSACTION_COMMITTED: [Code.FailedPrecondition, 410],
  TOO_LARGE: [Code.ResourceExhausted, 413],
  TOO_MANY_ITEMS: [Code.ResourceExhausted, 413],
  /** The package holds `limits.versions` versions already (docs/depot-api.md §8). */
  TOO_MANY_VERSIONS: [Code.ResourceExhausted, 413],
  /** The committing token's quota of bytes or versions would be passed (docs/depot-api.md §Quotas). */
  QUOTA_EXCEEDED: [Code.ResourceExhausted, 413],
  METHOD_NOT_ALLOWED: [Code.Unimplemented, 405],
  REQUEST_TIMEOUT: [Code.DeadlineExceeded, 408],
  RANGE_NOT_SATISFIABLE: [Code.OutOfRange, 416],
  COMMIT_INVALID: [Code.FailedPrecondition, 422],
  SELF_DEPENDENCY: [Code.FailedPrecondition, 422],
  TOO_MANY_TRANSACTIONS: [Code.ResourceExhausted, 429],
  HEADERS_TOO_LARGE: [Code.ResourceExhausted, 431],
  STORE_UNAVAILABLE: [Code.Unavailable, 503],
  TOO_MANY_CONNECTIONS: [Code.Unavailable, 503],
  /** Every delta build slot and queue place is taken (docs/depot-api.md §Deltas); `Retry-After: 1`. */
  TOO_MANY_DELTA_BUILDS: [Code.Unavailable, 503],
  /** Every pull-through slot is taken (docs/decisions/depot-yank-mirror.md, Pull-through); `Retry-After: 1`. */
  TOO_MANY_PULLS: [Code.Unavailable, 503],
  /** A pull-through miss the upstream could not answer: down, refusing, or failing a check; `Retry-After: 5`. */
  UPSTREAM_UNAVAILABLE: [Code.Unavailable, 503],
  /** The store was written by a newer runner-depot (depot/store/format.ts); the depot refuses to serve it. */
  STORE_FORMAT_UNSUPPORTED: [Code.FailedPrecondition, 503],
  // Client-side codes (installer, agent).
  DEPENDENCY_UNRESOLVED: [Code.NotFound, 422],
  DEPENDENCY_CONFLICT: [Code.FailedPrecondition, 422],
  DEPENDENCY_CYCLE: [Code.FailedPrecondition, 422],
  // A package archive from the depot that breaks the archive rules (installer, H4).
  ARCHIVE_INVALID: [Code.DataLoss, 502],
  // Signed versions (docs/depot-api.md §8 attestations; the installer's signature policy).
  /** An attestation that is not a Sigstore bundle of an in-toto statement. */
  ATTESTATION_INVALID: [Code.InvalidArgument, 400],
  /** A signature that does not verify with the key it names. */
  SIGNATURE_INVALID: [Code.FailedPrecondition, 422],
  /** Signed by a key the verifier does not trust, or outside the key's validity window. */
  KEY_UNTRUSTED: [Code.PermissionDenied, 422],
  /** Signed by a revoked key. */
  KEY_REVOKED: [Code.PermissionDenied, 422],
  /** A statement whose subjects are not this version's content (another version, or a changed file). */
  SUBJECT_MISMATCH: [Code.FailedPrecondition, 422],
  /** An unsigned version under the `require` policy. */
  SIGNATURE_REQUIRED: [Code.FailedPrecondition, 422],
  /** No provenance from a builder the policy names. */
  BUILDER_UNTRUSTED: [Code.FailedPrecondition, 422],
  /** An archived job's log object is gone (archive retention, a lifecycle rule, a deleted file): 410. */
  LOG_ARCHIVE_GONE: [Code.NotFound, 410],
} as const satisfies Record<string, readonly [Code, number]>;

/** A code every runner-depot error carries; UPPER_SNAKE, stable across releases. */
export type ErrorCode = keyof typeof CODES;

/** Options of {@link RunnerDepotError}. */
export interface RunnerDepotErrorOptions {
  /** The error that caused this one; kept, never shown to a remote caller. */
  cause?: unknown;
  /** Overrides the HTTP status the code maps to. */
  status?: number;
  /** Extra members for a problem document (`problems`, `retryAfter`, …). */
  details?: Record<string, unknown>;
}

/**
 * The error every part of runner-depot throws on purpose.
 *
 * @example
 * throw new RunnerDepotError("PATH_INVALID", "Pkg-Path must be relative: /etc/passwd");
 */
export class RunnerDepotError extends Error {
  override name = "RunnerDepotError";
  readonly code: ErrorCode;
  readonly status: number;
  readonly details: Record<string, unknown>;

  constructor(code: ErrorCode, message: string, options: RunnerDepotErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    // An unknown code (a server's, say) must not resolve to an Object.prototype member.
    if (!Object.hasOwn(CODES, code)) throw new TypeError(`Unknown error code ${String(code)}`);
    this.code = code;
    this.status = options.status ?? CODES[code][1];
    this.details = options.details ?? {};
  }

  /** The gRPC status code this error is reported with. */
  get grpcCode(): Code {
    return CODES[this.code][0];
  }

  /**
   * Turns anything thrown into a RunnerDepotError, keeping the original as `cause`.
   * A ConnectError keeps its gRPC meaning; anything unknown becomes INTERNAL.
   */
  static from(reason: unknown): RunnerDepotError {
    if (reason instanceof RunnerDepotError) return reason;
    if (reason instanceof ConnectError) {
      // Code.InvalidArgument → "INVALID_ARGUMENT": the gRPC names are our runner codes.
      const name = Code[reason.code].replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
      const code: ErrorCode = Object.hasOwn(CODES, name) ? (name as ErrorCode) : "INTERNAL";
      return new RunnerDepotError(code, reason.rawMessage, { cause: reason });
    }
    const message = reason instanceof Error ? reason.message : String(reason);
    return new RunnerDepotError("INTERNAL", message, { cause: reason });
  }

  /** This error as a connect-es ConnectError (metadata is added by the caller). */
  toConnectError(metadata?: HeadersInit): ConnectError {
    // Internal errors never leak their message to a remote caller.
    const message = this.code === "INTERNAL" ? "internal error" : this.message;
    return new ConnectError(message, this.grpcCode, metadata, undefined, this);
  }

  /**
   * This error as an RFC 9457 problem document. `type` is an identifier, not a link:
   * `urn:runner-depot:problem:<code in kebab-case>` (a URN names the problem without
   * claiming a web address the project does not own).
   */
  toProblem(): ProblemDocument {
    const internal = this.code === "INTERNAL";
    return {
      type: `urn:runner-depot:problem:${this.code.toLowerCase().replace(/_/g, "-")}`,
      title: titleOf(this.code),
      status: this.status,
      detail: internal ? "An internal error occurred." : this.message,
      code: this.code,
      ...this.details,
    };
  }
}

/** An RFC 9457 problem document as the depot sends it. */
export interface ProblemDocument {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: ErrorCode;
  [member: string]: unknown;
}

function titleOf(code: ErrorCode): string {
  const words = code.toLowerCase().split("_").join(" ");
  return words.charAt(0).toUpperCase() + words.slice(1);
}

/** True when `reason` is a RunnerDepotError with one of the given codes. */
export function isRunnerDepotError(reason: unknown, ...codes: ErrorCode[]): reason is RunnerDepotError {
  return reason instanceof RunnerDepotError && (codes.length === 0 || codes.includes(reason.code));
}
