/**
 * A version's attestations on a PackageStore: each bundle a content-addressed blob, listed
 * in one `attest/<name>/<version>` record (what garbage collection keeps and the
 * attestation route serves). Why: docs/decisions/signed-versions.md.
 */
import { RunnerDepotError } from "../../errors.js";
import { appendChange } from "../catalog/changes.js";
import type { PackageManifest } from "../package/archive.js";
import type { PackageStore } from "../ports.js";
import type { VerifiedAttestation } from "../signing/verify.js";
import { bundleOf, parseBundle } from "../signing/bundle.js";
import type { VersionContent } from "../signing/statement.js";
import { readVersionManifest } from "./blob-read.js";
import { keys, updateRecord, type VersionRecord } from "./records.js";

/** One attestation of a version as the depot lists it. */
export interface AttestationEntry {
  /**
   * The bundle's blob, `sha256:<hex>` of its JSON as the depot stores it: rebuilt from the signed parts (one shape,
   * ASCII) since 2026-12-02, the bytes as received before.
   */
  digest: string;
  size: number;
  keyId: string;
  predicateType: string;
  /** The signed time (the statement's). */
  signedAt: string;
  /** When the depot took it. */
  addedAt: string;
  builderId?: string;
  requestId?: string;
  /** Set while its change-feed entry may not be appended yet (never served; see addAttestation). */
  unsequenced?: true;
}

/** An `attest/<name>/<version>` record. */
export interface AttestationRecord {
  name: string;
  version: string;
  attestations: AttestationEntry[];
}

/** Attestations one version may carry: a bound on the record and on `GET /attestations`. */
export const MAX_ATTESTATIONS = 16;
/**
 * Bytes of stored bundles one version may carry in all: `GET /attestations` answers within it (and ~1 KiB an
 * entry), half of what a mirror reads of that answer (mirror/upstream.ts, 64 MiB). A bundle alone may be larger
 * than this only when the depot's `maxAttestationBytes` is.
 */
export const MAX_ATTESTATION_BYTES = 32 * 2 ** 20;

/** A published version's content as its statements name it: the archive's digest and each file's. O(items). */
export async function versionContent(store: PackageStore, version: VersionRecord): Promise<VersionContent> {
  const manifest = await readVersionManifest<PackageManifest>(store, version);
  if (!manifest) throw new RunnerDepotError("INTERNAL", `the manifest of ${version.name}@${version.version} is gone`);
  return {
    name: version.name,
    version: version.version,
    digest: version.digest,
    files: manifest.items.flatMap((item) =>
      item.type === "file" && item.digest ? [{ path: item.path, digest: item.digest }] : [],
    ),
  };
}

/**
 * Stores a verified attestation's bundle (as {@link storedBundle} makes it), lists it on its version and appends a change-feed entry
 * naming it (`attested`), so mirrors copy it; a bundle already listed is not listed twice. Answers
 * whether it was new. TOO_LARGE past {@link MAX_ATTESTATIONS} or {@link MAX_ATTESTATION_BYTES}. O(attestations of the
 * version) plus one append.
 *
 * Like a yank (depot/catalog/yank.ts) the entry is listed with `unsequenced` first, then the feed
 * entry appended, then the flag dropped: a call killed in between leaves the flag, and adding the
 * same bundle again appends the entry it missed.
 */
export async function addAttestation(
  store: PackageStore,
  version: VersionRecord,
  bundle: unknown,
  held: VerifiedAttestation,
  now: Date,
): Promise<{ entry: AttestationEntry; created: boolean }> {
  const bytes = storedBundle(bundle);
  const blob = await store.putBlob(
    (async function* () {
      yield bytes;
    })(),
  );
  const entry: AttestationEntry = {
    digest: blob.digest,
    size: blob.size,
    keyId: held.keyId,
    predicateType: held.predicateType,
    signedAt: held.signedAt,
    addedAt: now.toISOString(),
    ...(held.builderId !== undefined ? { builderId: held.builderId } : {}),
    ...(held.requestId !== undefined ? { requestId: held.requestId } : {}),
  };
  let created = false;
  let listed = entry;
  const key = keys.attestation(version.name, version.version);
  await updateRecord<AttestationRecord>(store, key, (current) => {
    const list = current?.value.attestations ?? [];
    // The same bytes, or the same signed statement stored before bundles were rebuilt (its digest is of the bytes
    // as received then): one key signs one statement of a type at one time.
    const found = list.find(
      (a) =>
        a.digest === blob.digest ||
        (a.keyId === entry.keyId && a.signedAt === entry.signedAt && a.predicateType === entry.predicateType),
    );
    created = found === undefined;
    if (found) {
      listed = found;
      return undefined;
    }
    if (list.length >= MAX_ATTESTATIONS)
      throw new RunnerDepotError(
        "TOO_LARGE",
        `${version.name}@${version.version} carries ${MAX_ATTESTATIONS} attestations already`,
      );
    const held = list.reduce((sum, a) => sum + a.size, 0);
    if (held + blob.size > MAX_ATTESTATION_BYTES)
      throw new RunnerDepotError(
        "TOO_LARGE",
        `${version.name}@${version.version} carries ${held} bytes of attestations; ${blob.size} more would pass ${MAX_ATTESTATION_BYTES}`,
      );
    listed = { ...entry, unsequenced: true };
    return { name: version.name, version: version.version, attestations: [...list, listed] };
  });
  if (listed.unsequenced) {
    await appendChange(store, {
      name: version.name,
      version: version.version,
      first: false,
      at: now.toISOString(),
      attested: blob.digest,
    });
    await updateRecord<AttestationRecord>(store, key, (current) => {
      const list = current?.value.attestations ?? [];
      if (!list.some((a) => a.digest === blob.digest && a.unsequenced)) return undefined;
      return { ...current!.value, attestations: list.map((a) => (a.digest === blob.digest ? sequenced(a) : a)) };
    });
  }
  return { entry: sequenced(listed), created };
}

/**
 * A (checked) bundle as the depot stores and serves it: rebuilt from its signed parts in the one shape this package
 * writes (signing/bundle.ts `bundleOf`), so a copy re-spaced, padded with other fields or with its base64 written
 * another way is the same bytes and the same attestation, and a mirror stores what its upstream did. O(bundle).
 */
function storedBundle(bundle: unknown): Buffer {
  return Buffer.from(JSON.stringify(bundleOf(parseBundle(bundle))), "utf8");
}

/** An entry without its `unsequenced` flag. */
function sequenced(entry: AttestationEntry): AttestationEntry {
  const { unsequenced: _, ...rest } = entry;
  return rest;
}

/** A version's attestation entries (none when it has no record). One read. */
export async function listAttestations(
  store: PackageStore,
  name: string,
  version: string,
): Promise<AttestationEntry[]> {
  const record = await store.getRecord<AttestationRecord>(keys.attestation(name, version));
  return (record?.value.attestations ?? []).map(sequenced);
}

/** Versions one job's record lists at most (a job publishing more still publishes; the list stops). */
const MAX_JOB_PUBLICATIONS = 1_000;

/** A `jobpub/<requestId>` record: what a job published with its own credentials. */
interface JobPublishedRecord {
  versions: Array<{ name: string; version: string; at: string }>;
}

/** Notes that job `requestId` published `name@version` (its provenance was attested). O(versions listed). */
export async function noteJobPublication(
  store: PackageStore,
  requestId: string,
  name: string,
  version: string,
  now: Date,
): Promise<void> {
  await updateRecord<JobPublishedRecord>(store, keys.jobPublished(requestId), (current) => {
    const versions = current?.value.versions ?? [];
    if (versions.length >= MAX_JOB_PUBLICATIONS || versions.some((v) => v.name === name && v.version === version))
      return undefined;
    return { versions: [...versions, { name, version, at: now.toISOString() }] };
  });
}

/**
 * What job `requestId` published with its own credentials, oldest first (one read).
 *
 * @example
 * const versions = await jobPublications(depot.store, requestId); // [{ name: "tool", version: "1.0.0", at }]
 */
export async function jobPublications(
  store: PackageStore,
  requestId: string,
): Promise<Array<{ name: string; version: string; at: string }>> {
  return (await store.getRecord<JobPublishedRecord>(keys.jobPublished(requestId)))?.value.versions ?? [];
}
