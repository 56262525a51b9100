/**
 * Copying a mirrored version's attestations: each bundle's statement and subjects checked against the content held
 * here (and, with trusted keys, its signature) before it is stored.
 * Why: docs/decisions/depot-yank-mirror.md, "mirror.ts".
 */
import { RunnerDepotError } from "../../errors.js";
import type { PackageStore } from "../ports.js";
import { keys, type VersionRecord } from "../store/records.js";
import { addAttestation, versionContent } from "../store/attestations.js";
import { IN_TOTO_PAYLOAD_TYPE, parseBundle } from "../signing/bundle.js";
import { checkSubjects, parseStatement } from "../signing/statement.js";
import type { loadTrustedKeys } from "../signing/keys.js";
import { verifyAttestation, type VerifiedAttestation } from "../signing/verify.js";
import type { Upstream } from "./upstream.js";

/**
 * Copies the attestations `name@version` carries upstream that this store lacks: each bundle's shape and
 * statement parsed and its subjects checked against the content held here (and, with `trusted`, its
 * signature) before it is stored; a bundle that fails stops the run (SUBJECT_MISMATCH, ATTESTATION_INVALID…).
 * Answers how many were new here. O(bundles × files); one bounded GET.
 */
export async function copyAttestations(
  store: PackageStore,
  upstream: Upstream,
  name: string,
  version: string,
  now: Date,
  trusted: ReturnType<typeof loadTrustedKeys> | undefined,
): Promise<number> {
  const record = (await store.getRecord<VersionRecord>(keys.version(name, version)))?.value;
  if (!record)
    throw new RunnerDepotError("UNAVAILABLE", `upstream: an attestation of ${name}@${version}, not mirrored here`);
  const bundles = await upstream.attestations(name, version);
  if (bundles.length === 0) return 0;
  const content = await versionContent(store, record);
  let added = 0;
  for (const bundle of bundles) {
    const held = trusted ? verifyAttestation(bundle, content, trusted, now) : checkedUnsigned(bundle, content);
    // Stored as rebuilt from its signed parts (addAttestation): the same bytes as the upstream's own.
    const { created } = await addAttestation(store, record, bundle, held, now);
    if (created) added++;
  }
  return added;
}

/** A bundle's shape, statement and subjects checked against `content`, its key taken at its word. */
function checkedUnsigned(bundle: unknown, content: Parameters<typeof checkSubjects>[1]): VerifiedAttestation {
  const parsed = parseBundle(bundle);
  if (parsed.payloadType !== IN_TOTO_PAYLOAD_TYPE)
    throw new RunnerDepotError("ATTESTATION_INVALID", `${content.name}@${content.version}: not an in-toto payload`);
  const statement = parseStatement(parsed.payload);
  checkSubjects(statement.statement, content);
  return {
    keyId: parsed.keyId,
    predicateType: statement.statement.predicateType,
    signedAt: new Date(statement.signedAt).toISOString(),
    ...(statement.builderId !== undefined ? { builderId: statement.builderId } : {}),
    ...(statement.requestId !== undefined ? { requestId: statement.requestId } : {}),
  };
}
