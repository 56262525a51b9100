/**
 * Mirroring one depot into another store: follows the upstream's change feed from the position saved
 * in the local store, copies each new version (its manifest, then only the item blobs the store
 * lacks, by byte range), rebuilds its archive locally and checks it against the upstream's digest
 * before the version becomes visible, and applies yanks. Every step is idempotent, so a run killed
 * anywhere resumes from the saved position without duplicates. A version whose manifest breaks a publish rule or
 * limit is not copied: it is reported (`refused`) and the run moves past it.
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
import { DEFAULT_LIMITS, type DepotLimits } from "../transactions/lifecycle.js";
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
import { checkManifest, isManifestRefusal, readManifest } from "./upstream-manifest.js";
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
   * The publish limits every copied version's manifest must keep (items, requirements, attributes, item bytes), as a
   * router's `limits`: the ones given, the rest DEFAULT_LIMITS (default: DEFAULT_LIMITS). Give the limits of the
   * router serving this store, or an upstream's higher ones: a version over them is not copied but reported in
   * `refused`, and the run moves past it.
   */
  publishLimits?: Partial<DepotLimits>;
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
  /** Called after each change applied (progress); with the refusal when the outcome is `refused`. */
  onChange?: (change: FeedChange, outcome: MirrorOutcome, refusal?: MirrorRefusal) => void;
  /** The clock (tests). */
  now?: () => Date;
}

/**
 * What applying one change did. `refused`: the version's manifest breaks a publish rule or limit here, so it was not
 * copied (MirrorReport.refused). `absent`: a yank or an attestation of a version this store does not hold (refused
 * earlier): nothing to apply.
 */
export type MirrorOutcome =
  "copied" | "present" | "yank" | "attestation" | "removed" | "deferred" | "refused" | "absent";

/** A version a run did not copy: its manifest breaks a publish rule or limit (`reason`, naming the code it breaks). */
export interface MirrorRefusal {
  /** The feed position of the change that named it (reset the saved position below it to read it again). */
  position: number;
  name: string;
  version: string;
  reason: string;
}

/** Refusals a report lists (`refusedCount` counts them all): bounds a long following run's memory. */
export const MAX_REFUSALS = 100;

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
  /**
   * Versions not copied because their manifest breaks a publish rule or limit here (`publishLimits`,
   * `limits.maxManifestBytes`), in feed order: the first MAX_REFUSALS. Nothing of them is stored and the position
   * moves past them; a version never changes, so a later run reads one again only from a reset position.
   */
  refused: MirrorRefusal[];
  /** All the versions refused, listed in `refused` or not. */
  refusedCount: number;
}

/** A report of nothing done yet, at `position`. */
function emptyReport(position: number): MirrorReport {
  return {
    position,
    copied: 0,
    present: 0,
    yanks: 0,
    attestations: 0,
    removed: 0,
    deferred: 0,
    bytesFetched: 0,
    blobsReused: 0,
    refused: [],
    refusedCount: 0,
  };
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
  const publishLimits: DepotLimits = { ...DEFAULT_LIMITS, ...options.publishLimits };
  const policy = loadPolicy(
    options.signatures ?? {
      policy: options.trustedKeys ? "verify" : "ignore",
      ...(options.trustedKeys ? { trustedKeys: options.trustedKeys } : {}),
    },
  );
  const key = mirrorKey(upstream.url);
  const saved = (await store.getRecord<MirrorState>(key))?.value;
  const report = emptyReport(saved?.position ?? 0);
  let batched = true;
  for (;;) {
    if (options.signal?.aborted) return report;
    let page: FeedPage & { versions?: Map<string, BatchVersion> };
    let prepared = new Map<string, Prepared>();
    try {
      // The batch reads first (one feed answer with every new version's manifest, then their missing blobs in a
      // few answers); an upstream without them is read version by version.
      const batch = batched ? await upstream.batchFeed(report.position) : null;
      if (batched && batch === null) batched = false;
      page = batch ?? (await upstream.feed(report.position));
      if (batch) prepared = await prefetch(store, upstream, batch, report, publishLimits);
    } catch (error) {
      if (options.signal?.aborted) return report;
      throw error;
    }
    for (const change of page.changes) {
      if (options.signal?.aborted) return report;
      let outcome: MirrorOutcome;
      let refusal: MirrorRefusal | undefined;
      try {
        outcome = await applyChange(store, upstream, change, now, report, policy, prepared, publishLimits);
      } catch (error) {
        // The version's own manifest breaks a publish rule or limit: it never changes, so stopping here would stop
        // the mirror for good. Nothing of it was stored; it is reported and passed over. Anything else (the network,
        // a digest mismatch, an archive without its manifest) stops the run before the entry, to be tried again.
        if (!isManifestRefusal(error)) throw error;
        refusal = { position: change.position, name: change.name, version: change.version, reason: error.message };
        if (report.refused.length < MAX_REFUSALS) report.refused.push(refusal);
        report.refusedCount++;
        outcome = "refused";
      }
      report.position = change.position;
      await savePosition(store, key, upstream.url, change.position, now);
      options.onChange?.(change, outcome, refusal);
    }
    if (page.changes.length === 0 && page.position > report.position) {
      report.position = page.position;
      await savePosition(store, key, upstream.url, page.position, now);
    }
    // The next page at once, without a pause: only a page that moved says `more` (parseFeedPage's full page ends past
    // its `since`; Upstream.batchFeed refuses one that says more without moving), so no feed loops in place.
    if (page.more) continue;
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
  publishLimits: DepotLimits,
): Promise<MirrorOutcome> {
  const name = parsePackageName(change.name);
  const version = parseVersion(change.version);
  const trusted = policy.policy === "ignore" ? undefined : policy.keys;
  const held = async () => (await store.getRecord(keys.version(name, version))) !== null;
  if (change.attested !== undefined) {
    // Under `require`, a version deferred for want of a signature is copied now that it has one.
    if (!(await held())) {
      if (policy.policy === "require")
        return copySigned(store, upstream, name, version, now, report, policy, publishLimits);
      // Not copied (its manifest was refused): nothing to attach the bundles to.
      return "absent";
    }
    report.attestations += await copyAttestations(store, upstream, name, version, now(), trusted);
    return "attestation";
  }
  if (change.removed) {
    // "absent": never copied, or removed already (a resumed run); "latest": this store's newest, kept (never removed).
    if ((await removeVersion(store, name, version, now())) === "removed") report.removed++;
    return "removed";
  }
  if (change.yanked !== undefined) {
    if (!(await held())) {
      if (policy.policy === "require") return (report.deferred++, "deferred");
      // Not copied (its manifest was refused): nothing to mark.
      return "absent";
    }
    // The upstream's own time of the mark, when it still has it (a later change may have replaced it).
    const listed = change.yanked === null ? undefined : await upstream.version(name, version);
    const at = listed?.yanked?.reason === change.yanked ? listed.yanked.at : undefined;
    await setYank(store, name, version, change.yanked, now(), { at });
    report.yanks++;
    return "yank";
  }
  if (policy.policy === "require")
    return copySigned(store, upstream, name, version, now, report, policy, publishLimits, prepared);
  const ready = prepared.get(`${name}@${version}`);
  const copied = await copyVersion(
    store,
    upstream,
    name,
    version,
    report,
    publishLimits,
    ready?.listed,
    "mirror",
    ready,
  );
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
  publishLimits: DepotLimits,
  prepared?: Map<string, Prepared>,
): Promise<MirrorOutcome> {
  const bundles = await upstream.attestations(name, version);
  if (bundles.length === 0) {
    report.deferred++;
    return "deferred";
  }
  const ready = prepared?.get(`${name}@${version}`);
  const listed = ready?.listed ?? (await upstream.version(name, version));
  const copied = await copyVersion(store, upstream, name, version, report, publishLimits, listed, "mirror", ready);
  const record = (await store.getRecord<VersionRecord>(keys.version(name, version)))!.value;
  // The record is written but not listed: a refusal here leaves nothing visible.
  const verified = verifyVersion(await versionContent(store, record), bundles, policy, now());
  const position = await publishVersion(store, name, version, now());
  await compactAfter(store, position);
  for (let i = 0; i < bundles.length; i++) {
    const { created } = await addAttestation(store, record, bundles[i], verified[i]!, now());
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
 * than `maxBytes`, and its manifest checked against the publish rules and `publishLimits` (the router's
 * `limits`; a refusal: isManifestRefusal); then published here (listed, with a change entry). True when
 * this call copied it. O(items) store calls, one range read per item blob the store lacks.
 */
export async function pullVersion(
  store: PackageStore,
  upstream: Upstream,
  name: string,
  version: string,
  now: () => Date,
  maxBytes: number,
  publishLimits: DepotLimits = DEFAULT_LIMITS,
): Promise<boolean> {
  const listed = await upstream.version(name, version);
  if (listed.size > maxBytes)
    throw new RunnerDepotError(
      "UNAVAILABLE",
      `upstream's ${name}@${version} is ${listed.size} bytes; pull-through takes at most ${maxBytes}`,
    );
  // Not copied on a pull (yet): its attestations stay upstream, so `require` clients verify there.
  const report = emptyReport(0);
  const copied = await copyVersion(store, upstream, name, version, report, publishLimits, listed, PULLED);
  const position = await publishVersion(store, name, version, now());
  await compactAfter(store, position);
  if (listed.yanked) await setYank(store, name, version, listed.yanked.reason, now(), { at: listed.yanked.at });
  return copied;
}

/**
 * Writes `name@version`'s blobs and version record unless the record is there; true when it wrote it.
 * The manifest is checked (publish rules, `publishLimits`) before anything is stored; the record is written only
 * after the archive rebuilt here hashes to the upstream's digest.
 */
async function copyVersion(
  store: PackageStore,
  upstream: Upstream,
  name: string,
  version: string,
  report: MirrorReport,
  publishLimits: DepotLimits,
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
  const { manifest, json } = ready ?? (await readManifest(upstream, name, version, listed.size, report, publishLimits));
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
    // As a publish records them: a name and a range each (a newer upstream's other members stay in the manifest).
    requires: manifest.requires.map(({ name: needed, range }) => ({ name: needed, range })),
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
 * fails a check (its manifest over maxManifestBytes, or breaking a publish rule or `publishLimits`) is left out here:
 * read alone, and refused there with the reason, as by a mirror without the batch reads.
 */
async function prefetch(
  store: PackageStore,
  upstream: Upstream,
  page: BatchFeedPage,
  report: MirrorReport,
  publishLimits: DepotLimits,
): Promise<Map<string, Prepared>> {
  const prepared = new Map<string, Prepared>();
  const fetched = new Set<string>();
  const wanted = new Map<string, { ref: string; digest: string; size: number }>();
  for (const change of page.changes) {
    const ref = `${change.name}@${change.version}`;
    const described = page.versions.get(ref);
    if (!described || change.yanked !== undefined || change.attested !== undefined || change.removed) continue;
    if (await store.getRecord(keys.version(change.name, change.version))) continue;
    // The bound of the one-by-one read, in bytes (the feed's text may hold characters of several).
    if (Buffer.byteLength(described.manifest, "utf8") > upstream.limits.maxManifestBytes) continue;
    let manifest: PackageManifest;
    try {
      manifest = JSON.parse(described.manifest) as PackageManifest;
      const bad = (why: string) => new RunnerDepotError("UNAVAILABLE", why);
      await checkManifest(manifest, change.name, change.version, bad, publishLimits);
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
