/**
 * The depot client's public types: its options, what each call answers, and the
 * {@link DepotClient} interface itself. Kept apart from the code so the installer can
 * name the client it drives without importing the client (no import cycle).
 */
import type { Writable } from "node:stream";
import type { PackageManifest } from "../install/manifest.js";
import type { InstallOptions, InstallResult } from "../install/types.js";
import type { Requirement } from "../install/resolve.js";
import type { SigningKey } from "../signing/keys.js";
import type { SignaturePolicy, VerifiedAttestation } from "../signing/verify.js";

/** Options of {@link createDepotClient}. */
export interface DepotClientOptions {
  /** The depot's base URL, e.g. `http://127.0.0.1:8080` or `https://depot.example/api`. */
  baseUrl: string | URL;
  /** A bearer token sent on every request. */
  token?: string;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /**
   * How many times a broken download is resumed without progress, or a commit answered 409 CONFLICT ("retry") is sent
   * again, before giving up. Default 5.
   */
  retries?: number;
  /** First retry delay in ms, doubled per retry up to 2 s. Default 100. */
  retryDelayMs?: number;
  /**
   * The longest wait, in ms, for each next chunk of any body the client reads (JSON,
   * errors, archives), and with the global `fetch` for a GET's answer to begin (a `fetch`
   * of your own bounds its own wait): past it the read fails with DEADLINE_EXCEEDED (a
   * download resumes, as after any break, up to `retries` times). Default 30,000.
   */
  idleTimeoutMs?: number;
  /** The longest a JSON or error body may take in all, in ms. Default 120,000. */
  jsonTimeoutMs?: number;
  /**
   * Refuse (TOO_LARGE) a JSON answer (one catalog page, `/version`, `/depend`) of more decoded bytes. Default 32 MiB.
   */
  maxJsonBytes?: number;
  /** `catalog()` refuses (TOO_LARGE) a walk of more pages than this. Default 10,000. */
  maxCatalogPages?: number;
  /** `catalog()` refuses (TOO_LARGE) a walk whose pages total more decoded bytes. Default 128 MiB. */
  maxCatalogBytes?: number;
}

/** `GET /catalog`, every page merged. */
export interface Catalog {
  packages: Record<string, { latest: string; versions: string[]; updatedAt: string }>;
  count: number;
  /** The change-sequence position the catalog is current to (absent from a depot older than 0.2). */
  position?: number;
  updatedAt: string | null;
}

/** One version in `GET /version/<name>`. */
export interface VersionEntry {
  version: string;
  publishedAt: string;
  digest: string;
  size: number;
  itemCount: number;
  attributes: Record<string, unknown>;
  /** Present when the version is yanked: resolution skips it unless it is asked for exactly. */
  yanked?: { reason: string; at: string };
}

/** `GET /version/<name>`. */
export interface VersionInfo {
  name: string;
  latest: string;
  versions: VersionEntry[];
}

/** `GET /depend/<name>[@<version>]`. */
export interface DependInfo {
  name: string;
  version: string;
  requires: Requirement[];
  /** The yank reason, when the version is yanked (the answer's `Pkg-Yanked` header). */
  yanked?: string;
}

/** The answer of {@link DepotClient.yank} and {@link DepotClient.unyank}. */
export interface YankResult {
  name: string;
  version: string;
  /** The reason now in force, or null when the version is not yanked. */
  yanked: string | null;
}

/** A download's progress: bytes received of the whole archive (`total` when known). */
export interface DownloadProgress {
  received: number;
  total?: number;
  /** Resumptions so far (after broken transfers). */
  resumes: number;
}

/** Options of {@link DepotClient.download}. */
export interface DownloadOptions {
  /** Fetch the delta from this installed version instead of the whole package. */
  from?: string;
  /**
   * A file path (written to `<path>.part`, renamed when the digest checks out, removed
   * otherwise), or a writable stream. Default: a new file under `os.tmpdir()`.
   */
  to?: string | Writable | WritableStream<Uint8Array>;
  onProgress?: (progress: DownloadProgress) => void;
  signal?: AbortSignal;
  /**
   * The archive's size as announced elsewhere (the `size` of `GET /version`): nothing
   * past it is written, and a longer body is refused (DIGEST_MISMATCH). Whatever is
   * given, a body is never read past its `Content-Length` or `Content-Range`.
   */
  expectedSize?: number;
  /**
   * Refuse (TOO_LARGE) a body longer than this many bytes, written up to it at most (a delta, whose size nothing
   * announces).
   */
  maxBytes?: number;
}

/** What a finished, verified download was. */
export interface DownloadResult {
  /** The final (immutable, after redirects) URL. */
  url: string;
  /** `sha256:<hex>` of the whole archive, checked against the server's Repr-Digest. */
  digest: string;
  size: number;
  etag: string | null;
  /** How many times the transfer was resumed with a Range request. */
  resumes: number;
  /** The file written, when `to` was a path or absent. */
  path?: string;
  /** The yank reason, when the version downloaded is yanked (the answer's `Pkg-Yanked` header). */
  yanked?: string;
}

/** A file, directory or link to publish. */
export type PublishItem =
  | {
      type: "file";
      path: string;
      mode?: number;
      /** read from this file on disk */ file?: string;
      /** or these bytes */ content?: Uint8Array | string;
    }
  | { type: "dir"; path: string; mode?: number }
  | { type: "link"; path: string; target: string };

/** Publish progress: after every item and as file bytes go out. */
export interface PublishProgress {
  item: number;
  items: number;
  path?: string;
  bytesSent: number;
  byReference: number;
}

/** Options of {@link DepotClient.publish}. */
export interface PublishOptions {
  name: string;
  version: string;
  /** Publish this directory's contents (files, directories, relative links, with modes). */
  dir?: string;
  /** Or these items. */
  items?: PublishItem[];
  /** `name` → SemVer range. */
  requires?: Record<string, string> | Requirement[];
  attributes?: Record<string, string>;
  license?: { name: string; text: string };
  /**
   * Offer each file by reference first (empty body + Content-Digest) and upload only on
   * 409 DIGEST_UNKNOWN. Default true; false uploads every file.
   */
  byReference?: boolean;
  onProgress?: (progress: PublishProgress) => void;
  /** Additions in flight at once. Default 4. */
  concurrency?: number;
  /**
   * Sign the version once committed (a signed-version statement over its archive and
   * files, attached by `POST /attestations`). The depot must trust the key.
   */
  sign?: SigningKey;
}

/** What a publish did. */
export interface PublishResult {
  url: string;
  name: string;
  version: string;
  digest: string;
  transaction: string;
  /** File bytes sent in request bodies. */
  bytesSent: number;
  /** Files the depot took by reference (no bytes sent). */
  byReference: number;
  /** Files uploaded. */
  uploaded: number;
}

/** One attestation as `GET /attestations/<name>@<version>` lists it. */
export interface AttestationListEntry {
  digest: string;
  size: number;
  keyId: string;
  predicateType: string;
  signedAt: string;
  addedAt: string;
  builderId?: string;
  requestId?: string;
  /** The Sigstore bundle itself. */
  bundle: unknown;
}

/** `GET /attestations/<name>@<version>`. */
export interface AttestationList {
  name: string;
  version: string;
  attestations: AttestationListEntry[];
}

/** The depot client. */
export interface DepotClient {
  readonly baseUrl: string;
  /**
   * `GET /catalog`, every page (following `Link: rel="next"`). Once it has a catalog it asks
   * only `?since=` its position, sending the last ETag: a 304 answers the cached catalog,
   * otherwise the changed packages are merged in, so staying current costs O(changes).
   */
  catalog(): Promise<Catalog>;
  /** `GET /version/<name>`. */
  versions(name: string): Promise<VersionInfo>;
  /** `GET /depend/<spec>` (`name` or `name@version`). */
  depends(spec: string): Promise<DependInfo>;
  /** Streams `/data/<spec>` (or a delta) to a file or stream, verifying and resuming. */
  download(spec: string, options?: DownloadOptions): Promise<DownloadResult>;
  /** The manifest of `/data/<spec>`, read from the archive's head with a Range request. */
  manifest(spec: string): Promise<PackageManifest>;
  /** Publishes a version through a transaction; abandons it on any failure. */
  publish(options: PublishOptions): Promise<PublishResult>;
  /** `GET /attestations/<name>@<version>`: the version's attestations (none from a depot without signed versions). */
  attestations(spec: string): Promise<AttestationList>;
  /** Signs a published version with `key` and attaches the signature; answers the bundle. */
  sign(spec: string, key: SigningKey): Promise<unknown>;
  /**
   * Verifies `name@version`'s attestations under `policy` against what the depot describes
   * (its `/version` digest and manifest); answers what held, or throws the refusal.
   */
  verify(spec: string, policy: SignaturePolicy): Promise<VerifiedAttestation[]>;
  /**
   * `POST /yank/<name>@<version>`: marks the version yanked with `reason` (publish permission). Resolution then skips
   * it; an exact request still gets it, with the reason in `yanked`.
   */
  yank(spec: string, reason: string): Promise<YankResult>;
  /** `DELETE /yank/<name>@<version>`: takes the mark back. */
  unyank(spec: string): Promise<YankResult>;
  /** Resolves, downloads, verifies and installs `spec` and its dependencies under `targetDir`. */
  install(spec: string, targetDir: string, options?: InstallOptions): Promise<InstallResult>;
}
