/**
 * The orchestrator's provenance at commit (issue 26): when a job's own credentials commit a
 * version, the depot's host (the orchestrator, not the VM) signs a SLSA Provenance v1
 * statement naming its builder ID, the job's repository and commit as the orchestrator was
 * told them when it launched the job, the job's request ID and the digest of its stored log,
 * and attaches it to the version. Why: docs/decisions/signed-versions.md, "Provenance".
 */
import type { PackageStore } from "../ports.js";
import { signBundle } from "../signing/bundle.js";
import type { SigningKey } from "../signing/keys.js";
import { provenanceStatement, type JobProvenanceSource } from "../signing/statement.js";
import { addAttestation, noteJobPublication, versionContent, type AttestationEntry } from "../store/attestations.js";
import { keys, type VersionRecord } from "../store/records.js";

export type { JobProvenanceSource };

/** Option `provenance` of createPackageRouter. */
export interface ProvenanceOptions {
  /** The orchestrator's signing key (clients trust it with a `builders` requirement). */
  key: SigningKey;
  /** The orchestrator's builder ID (a URI), named in every provenance. */
  builderId: string;
  /** The job a committing principal is, or null for anyone else (no provenance then). */
  jobOf(principal: string): Promise<JobProvenanceSource | null>;
}

/**
 * Signs and attaches the provenance of `name@version`, committed by `principal`, when the
 * principal is a job; null otherwise. O(items) (the statement names every file) plus what
 * `jobOf` costs (hashing the job's log: O(log)).
 *
 * @example
 * await attestProvenance(store, "tool", "1.0.0", "job:6f1c…", { key, builderId, jobOf }, new Date());
 */
export async function attestProvenance(
  store: PackageStore,
  name: string,
  version: string,
  principal: string,
  options: ProvenanceOptions,
  now: Date,
): Promise<AttestationEntry | null> {
  const job = await options.jobOf(principal);
  if (!job) return null;
  const record = (await store.getRecord<VersionRecord>(keys.version(name, version)))?.value;
  if (!record) return null;
  const statement = provenanceStatement(await versionContent(store, record), {
    builderId: options.builderId,
    requestId: job.requestId,
    repository: job.repository,
    commit: job.commit,
    logDigest: job.logDigest,
    ...(job.logLines !== undefined ? { logLines: job.logLines } : {}),
    ...(job.logUri !== undefined ? { logUri: job.logUri } : {}),
    ...(job.startedOn !== undefined ? { startedOn: job.startedOn } : {}),
    finishedOn: now.toISOString(),
  });
  const bundle = signBundle(Buffer.from(JSON.stringify(statement)), options.key);
  const { entry } = await addAttestation(
    store,
    record,
    bundle,
    {
      keyId: options.key.keyId,
      predicateType: statement.predicateType,
      signedAt: now.toISOString(),
      builderId: options.builderId,
      requestId: job.requestId,
    },
    now,
  );
  // The job's page lists what it published (the console reads it with jobPublications).
  await noteJobPublication(store, job.requestId, name, version, now);
  return entry;
}
