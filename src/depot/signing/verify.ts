/**
 * Judging a version's attestations under a signature policy (`ignore | verify | require`,
 * after pkg5's image signature-policy) with a set of trusted keys and, for provenance, the
 * builders a verifier accepts. Every refusal names the package, the version and the reason.
 * Why: docs/decisions/signed-versions.md.
 */
import { RunnerDepotError, type ErrorCode } from "../../errors.js";
import { IN_TOTO_PAYLOAD_TYPE, parseBundle, signatureHolds } from "./bundle.js";
import { loadTrustedKeys, type LoadedKey, type TrustedKeySet } from "./keys.js";
import { checkSubjects, parseStatement, type Statement, type VersionContent } from "./statement.js";

/** `ignore`: no check; `verify`: every attestation present must hold; `require`: and at least one must be there. */
export type SignaturePolicyMode = "ignore" | "verify" | "require";

/** What a client or installer checks a version's attestations against. */
export interface SignaturePolicy {
  policy: SignaturePolicyMode;
  /** The keys trusted (a `--trusted-keys` file's content). */
  trustedKeys?: TrustedKeySet;
  /**
   * Builder IDs accepted for provenance: when given (and the policy is not `ignore`), a
   * version must carry a SLSA provenance signed by a trusted key from one of them.
   */
  builders?: string[];
}

/** One attestation that held. */
export interface VerifiedAttestation {
  keyId: string;
  /** The trusted key's `name`, when it has one. */
  keyName?: string;
  predicateType: string;
  /** The signed time, ISO 8601. */
  signedAt: string;
  /** Provenance only: the builder and the job's request ID. */
  builderId?: string;
  requestId?: string;
}

/** A signing time this far past the verifier's clock is refused (clock skew allowed). */
const FUTURE_SKEW_MS = 5 * 60_000;

/** A policy with its keys parsed once (loadTrustedKeys is O(keys) and parses PEM). */
export interface LoadedPolicy {
  policy: SignaturePolicyMode;
  keys: Map<string, LoadedKey>;
  builders?: string[];
}

/** Parses a policy's keys once; BAD_REQUEST on a bad key or an unknown mode. */
export function loadPolicy(policy: SignaturePolicy): LoadedPolicy {
  if (!["ignore", "verify", "require"].includes(policy.policy))
    throw new RunnerDepotError("BAD_REQUEST", `signature policy must be ignore, verify or require`);
  return {
    policy: policy.policy,
    keys: loadTrustedKeys(policy.trustedKeys ?? { keys: [] }),
    ...(policy.builders ? { builders: policy.builders } : {}),
  };
}

/**
 * Checks one attestation (a bundle's JSON) against trusted keys and a version's content:
 * shape, key trusted and not revoked, signature, signing time within the key's window,
 * subjects. Throws the refusal; O(bundle + files).
 *
 * @example
 * const held = verifyAttestation(bundle, content, loadPolicy({ policy: "verify", trustedKeys }).keys, new Date());
 */
export function verifyAttestation(
  bundle: unknown,
  content: VersionContent,
  keys: Map<string, LoadedKey>,
  now: Date,
): VerifiedAttestation {
  const signed = verifySigner(bundle, content, keys, now);
  checkSubjects(signed.statement, content);
  return signed.held;
}

/**
 * Everything {@link verifyAttestation} checks but the subjects: shape, key trusted and not revoked, signature,
 * signing time. The depot's route runs it before it reads the version's manifest (O(items)), so a bundle by a key
 * it does not trust costs no manifest read. Throws the refusal naming `ref`; O(bundle).
 *
 * @example
 * const { held, statement } = verifySigner(bundle, { name: "tool", version: "1.0.0" }, keys, new Date());
 */
export function verifySigner(
  bundle: unknown,
  ref: Pick<VersionContent, "name" | "version">,
  keys: Map<string, LoadedKey>,
  now: Date,
): { held: VerifiedAttestation; statement: Statement } {
  const content = { ...ref, digest: "", files: [] };
  const refuse = (code: ErrorCode, reason: string) => refusal(code, content, reason);
  let parsed;
  try {
    parsed = parseBundle(bundle);
  } catch (error) {
    throw refuse("ATTESTATION_INVALID", (error as Error).message);
  }
  if (parsed.payloadType !== IN_TOTO_PAYLOAD_TYPE)
    throw refuse("ATTESTATION_INVALID", `payloadType ${parsed.payloadType.slice(0, 100)} is not in-toto`);
  const key = keys.get(parsed.keyId);
  if (!key) throw refuse("KEY_UNTRUSTED", `signed by key ${parsed.keyId}, which is not trusted`);
  if (key.revokedAt !== undefined) throw refuse("KEY_REVOKED", `signed by key ${parsed.keyId}, which is revoked`);
  if (!signatureHolds(parsed, key.key))
    throw refuse("SIGNATURE_INVALID", `the signature by key ${parsed.keyId} does not verify`);
  let statement;
  try {
    statement = parseStatement(parsed.payload);
  } catch (error) {
    throw refuse("ATTESTATION_INVALID", (error as Error).message);
  }
  const signedAt = statement.signedAt;
  if (signedAt < key.from || signedAt >= key.until)
    throw refuse(
      "KEY_UNTRUSTED",
      `signed by key ${parsed.keyId} at ${new Date(signedAt).toISOString()}, outside its validity window`,
    );
  if (signedAt > now.getTime() + FUTURE_SKEW_MS)
    throw refuse("SIGNATURE_INVALID", `signed at ${new Date(signedAt).toISOString()}, in the future`);
  const held: VerifiedAttestation = {
    keyId: parsed.keyId,
    ...(key.name !== undefined ? { keyName: key.name } : {}),
    predicateType: statement.statement.predicateType,
    signedAt: new Date(signedAt).toISOString(),
    ...(statement.builderId !== undefined ? { builderId: statement.builderId } : {}),
    ...(statement.requestId !== undefined ? { requestId: statement.requestId } : {}),
  };
  return { held, statement: statement.statement };
}

/**
 * Judges all of a version's attestations under `policy`: under `verify` and `require`
 * each must hold; under `require` there must be one; with `builders`, one must be a
 * provenance from one of them. Returns what held (nothing under `ignore`).
 *
 * @example
 * const held = verifyVersion(content, bundles, loadPolicy({ policy: "require", trustedKeys }));
 */
export function verifyVersion(
  content: VersionContent,
  bundles: readonly unknown[],
  policy: LoadedPolicy,
  now = new Date(),
): VerifiedAttestation[] {
  if (policy.policy === "ignore") return [];
  if (bundles.length === 0 && policy.policy === "require")
    throw refusal("SIGNATURE_REQUIRED", content, "unsigned, and the policy requires a signature");
  const held = bundles.map((bundle) => verifyAttestation(bundle, content, policy.keys, now));
  if (policy.builders && policy.builders.length > 0) {
    const built = held.some((a) => a.builderId !== undefined && policy.builders!.includes(a.builderId));
    if (!built)
      throw refusal(
        "BUILDER_UNTRUSTED",
        content,
        `no provenance from ${policy.builders.join(" or ")}${
          held.some((a) => a.builderId) ? ` (built by ${held.find((a) => a.builderId)!.builderId})` : ""
        }`,
      );
  }
  return held;
}

/** A refusal naming the package, the version and the reason (also as `details`). */
function refusal(code: ErrorCode, content: VersionContent, reason: string): RunnerDepotError {
  const spec = `${content.name}@${content.version}`;
  const message = reason.startsWith(`${spec}: `) ? reason : `${spec}: ${reason}`;
  return new RunnerDepotError(code, message, {
    details: { package: content.name, version: content.version, reason: message.slice(spec.length + 2) },
  });
}
