/**
 * Mirroring one depot into another store: follows the upstream's change feed from the position saved
 * in the local store, copies each new version (its manifest, then only the item blobs the store
 * lacks, by byte range), rebuilds its archive locally and checks it against the upstream's digest
 * before the version becomes visible, and applies yanks. Every step is idempotent, so a run killed
 * anywhere resumes from the saved position without duplicates.
 * Why: docs/decisions/depot-yank-mirror.md, "mirror.ts".
 */
import { createHash } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";
import { archiveLayout, commitArchive, type PackageManifest } from "../package/archive.js";
import { keepArchive } from "../package/archive-keeper.js";
import { parsePackageName, parseVersion } from "../package/names.js";
import { publishVersion } from "../catalog/packages.js";
import { compactAfter } from "../catalog/pages.js";
import { setYank } from "../catalog/yank.js";
import { removeVersion } from "../catalog/removal.js";
import type { PackageStore } from "../ports.js";
import { keys, updateRecord, type VersionRecord } from "../store/records.js";
import { notePublished } from "../transactions/references.js";
import { addAttestation, versionContent } from "../store/attestations.js";
import type { TrustedKeySet } from "../signing/keys.js";
import { loadPolicy, verifyVersion, type LoadedPolicy, type SignaturePolicy } from "../signing/verify.js";
import {
  Upstream,
  UPSTREAM_LIMITS,
  type BatchFeedPage,
  type BatchVersion,
  type FeedChange,
  type FeedPage,
  type UpstreamLimits,
  type UpstreamVersion,
} from "./upstream.js";
import { checkManifest, readManifest } from "./upstream-manifest.js";
import { copyAttestations } from "./mirror-attestations.js";

/** Options of {@link mirrorDepot}. */
export interface MirrorOptions {
  /** The upstream depot's base URL (what its clients use). */
  upstream: string;
  /** A bearer token with read on every package of the upstream. */
  token?: string;
  /** Keep following: poll the feed again every `intervalMs` once caught up, until `signal` aborts. */
  follow?: boolean;
  /** The wait between polls while following, ms (default 5,000). */
  intervalMs?: number;
  /** Stops a run (a following one ends without error). */
  signal?: AbortSignal;
  /** Bounds of every read from the upstream. */
  limits?: Partial<UpstreamLimits>;
  /**
   * When given, every attestation copied must also be signed by one of these keys, valid and not revoked
   * (the mirror's `verify` policy); without it each is checked for shape and subjects only.
   */
  trustedKeys?: TrustedKeySet;
  /**
   * The signature policy, as the installer's: `ignore` (attestations copied with their subjects checked), `verify`
   * (each copied must be signed by a trusted key), `require` (and a version is copied only once it carries one that
   * holds: an unsigned version is deferred until an attestation of it appears in the feed). Default: `verify` with
   * `trustedKeys`, else `ignore`.
   */
  signatures?: SignaturePolicy;
  /** Called after each change applied (progress). */
  onChange?: (change: FeedChange, outcome: MirrorOutcome) => void;
  /** The clock (tests). */
  now?: () => Date;
}

/** What applying one change did. */
export type MirrorOutcome = "copied" | "present" | "yank" | "attestation" | "removed" | "deferred";

/** What a run did. */
export interface MirrorReport {
  /** The upstream position the local store is complete through. */
  position: number;
  copied: number;
  /** Versions found already present (a resumed run's last change, or a shared store). */
  present: number;
  yanks: number;
  /** Attestation bundles stored here (new to this store). */
  attestations: number;
  /** Versions removed here because the upstream removed them (its retention). */
  removed: number;
  /** Under `require`: changes of versions not copied (yet), since they carry no signature that holds. */
  deferred: number;
  /** Item and manifest bytes read from the upstream's archives. */
  bytesFetched: number;
  /** Item blobs the store already held, not fetched. */
  blobsReused: number;
}

/** The `mirror/<hash>` record: where the mirror of one upstream is complete through. */
interface MirrorState {
  upstream: string;
  position: number;
  at: string;
}

/** The record key of the mirror state of `upstream`. */
export const mirrorKey = (upstream: string) =>
  `mirror/${createHash("sha256").update(upstream.replace(/\/+$/, "")).digest("hex").slice(0, 32)}`;

/**
 * Mirrors `options.upstream` into `store`: once (to the upstream's head) or, with `follow`, until
 * `signal` aborts. O(changes since the saved position) feed reads, plus per new version one
 * listing, two small ranges for the manifest and one range per item blob the store lacks.
 *
 * @example
 * const report = await mirrorDepot(createFsStore("/var/lib/mirror"), { upstream: "https://depot.example.com" });
 */
export async function mirrorDepot(store: PackageStore, options: MirrorOptions): Promise<MirrorReport> {
  const upstream = new Upstream(
    options.upstream,
    options.token,
    { ...UPSTREAM_LIMITS, ...options.limits },
    options.signal,
  );
  const now = options.now ?? (() => new Date());
  const policy = loadPolicy(
    options.signatures ?? {
      policy: options.trustedKeys ? "verify" : "ignore",
      ...(options.trustedKeys ? { trustedKeys: options.trustedKeys } : {}),
    },
  );
  const key = mirrorKey(upstream.url);
  const saved = (await store.getRecord<MirrorState>(key))?.value;
  const report: MirrorReport = {
    position: saved?.position ?? 0,
    copied: 0,
    present: 0,
    yanks: 0,
    attestations: 0,
    removed: 0,
    deferred: 0,
    bytesFetched: 0,
    blobsReused: 0,
  };
  let batched = true;
  for (;;) {
    if (options.signal?.aborted) return report;
    const since = report.position;
    let page: FeedPage & { versions?: Map<string, BatchVersion> };
    let prepared = new Map<string, Prepared>();
    try {
      // The batch reads first (one feed answer with every new version's manifest, then their missing blobs in a
      // few answers); an upstream without them is read version by version.
      const batch = batched ? await upstream.batchFeed(report.position) : null;
      if (batched && batch === null) batched = false;
      page = batch ?? (await upstream.feed(report.position));
      if (batch) prepared = await prefetch(store, upstream, batch, report);
    } catch (error) {
      if (options.signal?.aborted) return report;
      throw error;
    }
    for (const change of page.changes) {
      if (options.signal?.aborted) return report;
      const outcome = await applyChange(store, upstream, change, now, report, policy, prepared);
      report.position = change.position;
      await savePosition(store, key, upstream.url, change.position, now);
      options.onChange?.(change, outcome);
    }
    if (page.changes.length === 0 && page.position > report.position) {
      report.position = page.position;
      await savePosition(store, key, upstream.url, page.position, now);
    }
    if (page.more) {
      // The next page is asked for at once, without a pause: only a page that moved may say so (Upstream.batchFeed
      // refuses one that does not; this keeps any feed from looping in place).
      if (report.position <= since)
        throw new RunnerDepotError("UNAVAILABLE", `upstream ${upstream.url}: a feed page says more but moved nothing`);
      continue;
    }
    if (!options.follow) return report;
    await pause(options.intervalMs ?? 5_000, options.signal);
  }
}

async function savePosition(store: PackageStore, key: string, upstream: string, position: number, now: () => Date) {
  await updateRecord<MirrorState>(store, key, (current) =>
    current && current.value.position >= position ? undefined : { upstream, position, at: now().toISOString() },
  );
}

async function applyChange(
  store: PackageStore,
  upstream: Upstream,
  change: FeedChange,
  now: () => Date,
  report: MirrorReport,
  policy: LoadedPolicy,
  prepared: Map<string, Prepared>,
): Promise<MirrorOutcome> {
  const name = parsePackageName(change.name);
  const version = parseVersion(change.version);
  const trusted = policy.policy === "ignore" ? undefined : policy.keys;
  const held = async () => (await store.getRecord(keys.version(name, version))) !== null;
  if (change.attested !== undefined) {
    // Under `require`, a version deferred for want of a signature is copied now that it has one.
    if (policy.policy === "require" && !(await held()))
      return copySigned(store, upstream, name, version, now, report, policy);
    report.attestations += await copyAttestations(store, upstream, name, version, now(), trusted);
    return "attestation";
  }
  if (change.removed) {
    // "absent": never copied, or removed already (a resumed run); "latest": this store's newest, kept (never removed).
    if ((await removeVersion(store, name, version, now())) === "removed") report.removed++;
    return "removed";
  }
  if (change.yanked !== undefined) {
    if (policy.policy === "require" && !(await held())) return (report.deferred++, "deferred");
    // The upstream's own time of the mark, when it still has it (a later change may have replaced it).
    const listed = change.yanked === null ? undefined : await upstream.version(name, version);
    const at = listed?.yanked?.reason === change.yanked ? listed.yanked.at : undefined;
    await setYank(store, name, version, change.yanked, now(), { at });
    report.yanks++;
    return "yank";
  }
  if (policy.policy === "require") return copySigned(store, upstream, name, version, now, report, policy, prepared);
  const ready = prepared.get(`${name}@${version}`);
  const copied = await copyVersion(store, upstream, name, version, report, ready?.listed, "mirror", ready);
  const position = await publishVersion(store, name, version, now());
  await compactAfter(store, position);
  if (copied) report.copied++;
  else report.present++;
  return copied ? "copied" : "present";
}

/**
 * Under `require`: `name@version` copied and listed only when the upstream lists attestations of it that hold under
 * the policy (checked against the content copied here, before the version is listed); none: deferred (nothing
 * copied). Its bundles are stored with it, and a yank the upstream lists is applied. One GET of the attestations
 * (and, when the version is new, of its listing for the yank) beyond the copy.
 */
async function copySigned(
  store: PackageStore,
  upstream: Upstream,
  name: string,
  version: string,
  now: () => Date,
  report: MirrorReport,
  policy: LoadedPolicy,
  prepared?: Map<string, Prepared>,
): Promise<MirrorOutcome> {
  const bundles = await upstream.attestations(name, version);
  if (bundles.length === 0) {
    report.deferred++;
    return "deferred";
  }
  const ready = prepared?.get(`${name}@${version}`);
  const listed = ready?.listed ?? (await upstream.version(name, version));
  const copied = await copyVersion(store, upstream, name, version, report, listed, "mirror", ready);
  const record = (await store.getRecord<VersionRecord>(keys.version(name, version)))!.value;
  // The record is written but not listed: a refusal here leaves nothing visible.
  const verified = verifyVersion(await versionContent(store, record), bundles, policy, now());
  const position = await publishVersion(store, name, version, now());
  await compactAfter(store, position);
  for (let i = 0; i < bundles.length; i++) {
    const { created } = await addAttestation(
      store,
      record,
      Buffer.from(JSON.stringify(bundles[i])),
      verified[i]!,
      now(),
    );
    if (created) report.attestations++;
  }
  if (listed.yanked) await setYank(store, name, version, listed.yanked.reason, now(), { at: listed.yanked.at });
  if (copied) report.copied++;
  else report.present++;
  return copied ? "copied" : "present";
}

/** The `transaction` prefix of a version pull-through copied (`pull:<upstream>`): /version marks it `pulled`. */
export const PULLED = "pull";

/**
 * Pull-through's copy of one version (depot/mirror/pull-through.ts): the mirror's per-version copy,
 * its digest check and body bounds, refused before any byte is fetched when the upstream lists more
 * than `maxBytes`; then published here (listed, with a change entry). True when this call copied it.
 * O(items) store calls, one range read per item blob the store lacks.
 */
export async function pullVersion(
  store: PackageStore,
  upstream: Upstream,
  name: string,
  version: string,
  now: () => Date,
  maxBytes: number,
): Promise<boolean> {
  const listed = await upstream.version(name, version);
  if (listed.size > maxBytes)
    throw new RunnerDepotError(
      "UNAVAILABLE",
      `upstream's ${name}@${version} is ${listed.size} bytes; pull-through takes at most ${maxBytes}`,
    );
  // Not copied on a pull (yet): its attestations stay upstream, so `require` clients verify there.
  const report: MirrorReport = {
    position: 0,
    copied: 0,
    present: 0,
    yanks: 0,
    attestations: 0,
    removed: 0,
    deferred: 0,
    bytesFetched: 0,
    blobsReused: 0,
  };
  const copied = await copyVersion(store, upstream, name, version, report, listed, PULLED);
  const position = await publishVersion(store, name, version, now());
  await compactAfter(store, position);
  if (listed.yanked) await setYank(store, name, version, listed.yanked.reason, now(), { at: listed.yanked.at });
  return copied;
}

/**
 * Writes `name@version`'s blobs and version record unless the record is there; true when it wrote it.
 * The record is written only after the archive rebuilt here hashes to the upstream's digest.
 */
async function copyVersion(
  store: PackageStore,
  upstream: Upstream,
  name: string,
  version: string,
  report: MirrorReport,
  known?: UpstreamVersion,
  origin = "mirror",
  ready?: Prepared,
): Promise<boolean> {
  const listed = known ?? (await upstream.version(name, version));
  const existing = (await store.getRecord<VersionRecord>(keys.version(name, version)))?.value;
  if (existing) {
    if (existing.digest !== listed.digest)
      throw new RunnerDepotError(
        "VERSION_EXISTS",
        `${name}@${version} is held here with digest ${existing.digest}, upstream has ${listed.digest}`,
      );
    return false;
  }
  const mtime = Date.parse(listed.publishedAt) / 1000;
  if (!Number.isSafeInteger(mtime) || mtime < 0)
    throw new RunnerDepotError("UNAVAILABLE", `upstream: ${name}@${version} has no whole-second publishedAt`);
  const { manifest, json } = ready ?? (await readManifest(upstream, name, version, listed.size, report));
  const layout = archiveLayout(manifest, json, mtime);
  if (layout.size !== listed.size)
    throw new RunnerDepotError(
      "DIGEST_MISMATCH",
      `${name}@${version}: the manifest lays out ${layout.size} bytes, upstream lists ${listed.size}`,
    );
  // Each distinct blob once: fetched only when the store lacks it, checked against its digest as it is stored.
  const seen = new Set<string>();
  for (const part of layout.parts) {
    if (part.kind !== "blob" || seen.has(part.digest)) continue;
    seen.add(part.digest);
    if (await store.statBlob(part.digest)) {
      if (!ready?.fetched.has(part.digest)) report.blobsReused++;
      continue;
    }
    await store.putBlob(upstream.range(name, version, part.offset, part.length), {
      expectedDigest: part.digest,
      maxBytes: part.length,
      size: part.length,
    });
    report.bytesFetched += part.length;
  }
  const manifestBlob = await store.putBlob(once(json));
  const archive = await commitArchive(store, manifest, mtime, json);
  if (archive.digest !== listed.digest || archive.size !== listed.size)
    throw new RunnerDepotError(
      "DIGEST_MISMATCH",
      `${name}@${version}: the archive rebuilt here is ${archive.digest}, upstream lists ${listed.digest}`,
    );
  if (store.signBlobUrl) void keepArchive(store, layout, archive);
  const record: VersionRecord = {
    name,
    version,
    publishedAt: manifest.publishedAt,
    mtime,
    digest: archive.digest,
    size: archive.size,
    manifest: manifestBlob.digest,
    itemCount: manifest.items.length,
    attributes: manifest.attributes,
    requires: manifest.requires,
    transaction: `${origin}:${upstream.url}`.slice(0, 512),
  };
  if ((await store.putRecord(keys.version(name, version), record, { ifRevision: null })) === null) {
    // Another run wrote it meanwhile: the same bytes, or a conflict.
    const winner = (await store.getRecord<VersionRecord>(keys.version(name, version)))?.value;
    if (winner?.digest !== record.digest)
      throw new RunnerDepotError("VERSION_EXISTS", `${name}@${version} was written here with another digest`);
    return false;
  }
  await notePublished(store, name, seen);
  return true;
}

/** A version the batch feed described, its manifest checked and its missing blobs stored: copied without a read. */
interface Prepared {
  listed: UpstreamVersion;
  manifest: PackageManifest;
  json: Buffer;
  /** The blobs the page's batch fetched (not counted as reused when the copy finds them). */
  fetched: Set<string>;
}

/** Blobs per `POST /mirror/blobs`, and their most bytes (the upstream takes up to 1,000 and 256 MiB). */
const BLOBS_PER_ANSWER = 1000;
const BYTES_PER_ANSWER = 64 * 2 ** 20;

/**
 * For each version of a batch feed page this store lacks: its manifest checked and laid out against its listing,
 * then every blob it needs that the store lacks fetched in few answers, each checked against its digest as it is
 * stored. O(items of the page's new versions) store calls, ⌈blobs / 1,000⌉ requests. A version whose description
 * fails a check is left out here (read alone, and refused there with the reason).
 */
async function prefetch(
  store: PackageStore,
  upstream: Upstream,
  page: BatchFeedPage,
  report: MirrorReport,
): Promise<Map<string, Prepared>> {
  const prepared = new Map<string, Prepared>();
  const fetched = new Set<string>();
  const wanted = new Map<string, { ref: string; digest: string; size: number }>();
  for (const change of page.changes) {
    const ref = `${change.name}@${change.version}`;
    const described = page.versions.get(ref);
    if (!described || change.yanked !== undefined || change.attested !== undefined || change.removed) continue;
    if (await store.getRecord(keys.version(change.name, change.version))) continue;
    let manifest: PackageManifest;
    try {
      manifest = JSON.parse(described.manifest) as PackageManifest;
      await checkManifest(manifest, change.name, change.version, (why) => new RunnerDepotError("UNAVAILABLE", why));
    } catch {
      continue;
    }
    const json = Buffer.from(described.manifest, "utf8");
    const mtime = Date.parse(described.publishedAt) / 1000;
    if (!Number.isSafeInteger(mtime) || mtime < 0 || archiveLayout(manifest, json, mtime).size !== described.size)
      continue;
    for (const part of archiveLayout(manifest, json, mtime).parts) {
      if (part.kind !== "blob") continue;
      // Another new version of the page needs it too: fetched once, reused by this one.
      if (wanted.has(part.digest)) report.blobsReused++;
      else if (!(await store.statBlob(part.digest)))
        wanted.set(part.digest, { ref, digest: part.digest, size: part.length });
    }
    const listed = {
      version: change.version,
      publishedAt: described.publishedAt,
      digest: described.digest,
      size: described.size,
    };
    prepared.set(ref, { listed, manifest, json, fetched });
  }
  const all = [...wanted.values()];
  for (let i = 0; i < all.length;) {
    const chunk: typeof all = [];
    let bytes = 0;
    while (
      i < all.length &&
      chunk.length < BLOBS_PER_ANSWER &&
      (chunk.length === 0 || bytes + all[i]!.size <= BYTES_PER_ANSWER)
    ) {
      bytes += all[i]!.size;
      chunk.push(all[i++]!);
    }
    const pieces = await upstream.blobs(chunk);
    try {
      for (const blob of chunk) {
        await store.putBlob(pieces.take(blob.size), { expectedDigest: blob.digest, maxBytes: blob.size });
        report.bytesFetched += blob.size;
        fetched.add(blob.digest);
      }
    } finally {
      await pieces.close();
    }
  }
  return prepared;
}

async function* once(bytes: Buffer): AsyncGenerator<Uint8Array> {
  yield bytes;
}

function pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}
