/**
 * The package depot of runner-depot: a transactional REST package repository.
 *
 * - **Server:** {@link createPackageRouter} answers the installer API (catalog, versions,
 *   dependencies, data, deltas) and the packager API (transactions) as a `fetch(Request)`
 *   handler over any {@link PackageStore}; {@link servePackageRouter} serves it on
 *   node:http; {@link bearerTokens} builds an `authorize` hook from scoped tokens.
 * - **Client:** {@link createDepotClient} lists, publishes (by reference first, so no byte
 *   travels twice), downloads with resume, and installs with dependency resolution,
 *   digest checks and deltas for upgrades.
 * - **Signed versions:** {@link generateSigningKey} makes an Ed25519 key; `publish({ sign })`
 *   attaches a Sigstore bundle over the version's archive and files, and `install(…, {
 *   signatures })` or `client.verify` checks them under `ignore | verify | require`.
 * - **Mirror:** {@link mirrorDepot} copies another depot's versions and yanks into a store,
 *   following its change feed from where the last run stopped.
 * - **Stores:** {@link composeStore} joins a blob store and a record store (S3 +
 *   PostgreSQL) into one {@link PackageStore}.
 *
 * The HTTP interface is specified in [docs/depot-api.md](../../docs/depot-api.md) and
 * [openapi.yaml](../../openapi.yaml).
 *
 * @example
 * ```ts
 * import { createPackageRouter, servePackageRouter, bearerTokens, createDepotClient } from "runner-depot/depot";
 * import { createFsStore } from "runner-depot/adapters/fs";
 *
 * const token = process.env.DEPOT_TOKEN!;
 * const depot = createPackageRouter(createFsStore("./depot"), {
 *   authorize: bearerTokens({ [token]: ["*"] }, { publicRead: true }),
 * });
 * const server = await servePackageRouter(depot, { port: 8080 });
 *
 * const client = createDepotClient({ baseUrl: server.url, token });
 * await client.publish({ name: "toolchain", version: "1.4.0", dir: "./out" });
 * await client.install("toolchain@^1", "./vendor");
 * ```
 *
 * @module runner-depot/depot
 */
// First: throws on an unsupported Node before the rest loads (node-support.ts).
import "../node-check.js";
export type * from "./ports.js";
export { composeStore } from "./store/compose.js";
export type { ComposeStoreOptions } from "./store/compose.js";
export { createDepotClient } from "./client/depot-client.js";
export type * from "./client/types.js";
export { readInstalled } from "./install/installer.js";
export type {
  InstallOptions,
  InstallProgress,
  InstallAction,
  InstallResult,
  InstalledEntry,
  InstalledState,
} from "./install/installer.js";
export type { PreserveMode } from "./install/preserve.js";
export type { Requirement, ResolveOptions } from "./install/resolve.js";
export type { ManifestItem, PackageManifest } from "./install/manifest.js";
export { createPackageRouter } from "./server/router.js";
export type { PackageRouter, PackageRouterOptions } from "./server/router.js";
export { servePackageRouter } from "./server/serve.js";
export { createNodeHandler } from "./server/node-handler.js";
export type { NodeHandler, NodeHandlerOptions, NodeFetchHandler } from "./server/node-handler.js";
export { applyConnectionLimits } from "./server/connection-limits.js";
export type { ConnectionLimits } from "./server/connection-limits.js";
export type {
  PackageServer,
  ServePackageRouterOptions,
  FetchHandler,
  CloseOptions,
  CloseReport,
} from "./server/serve.js";
export { silentLogger } from "../telemetry.js";
export type { Logger, LogFn, TelemetryOptions } from "../telemetry.js";
export { bearerTokens, tokenPrincipal } from "./server/auth.js";
export type { Authorize, AuthorizeContext, BearerTokensOptions, DepotAction, TokenScopes } from "./server/auth.js";
export type { DepotLimits } from "./transactions/lifecycle.js";
export type { CommitProblem } from "./transactions/commit.js";
export type { GarbageReport } from "./store/gc.js";
export { generateSigningKey, signingKeyFromPem } from "./signing/keys.js";
export type { GeneratedKey, SigningKey, TrustedKey, TrustedKeySet } from "./signing/keys.js";
export type { SignaturePolicy, SignaturePolicyMode, VerifiedAttestation } from "./signing/verify.js";
export type { JobProvenanceSource, ProvenanceOptions } from "./transactions/provenance.js";
export { mirrorDepot } from "./mirror/mirror.js";
export type { MirrorOptions, MirrorOutcome, MirrorRefusal, MirrorReport } from "./mirror/mirror.js";
export { runRetention } from "./store/retention.js";
export type {
  RetentionPolicy,
  RetentionOptions,
  RetentionReport,
  RetentionReason,
  RetainedOut,
} from "./store/retention.js";
export type { Quota, QuotaOf } from "./store/quota.js";
export type { FeedChange, UpstreamLimits } from "./mirror/upstream.js";
export type { PullThroughOptions } from "./mirror/pull-through.js";
