/** runner-depot/depot: the package depot (router, server, client, installer). */
export type * from "./ports.js";
export { composeStore } from "./compose.js";
export type { ComposeStoreOptions } from "./compose.js";
export { createDepotClient } from "./client.js";
export type {
  DepotClient,
  DepotClientOptions,
  Catalog,
  VersionEntry,
  VersionInfo,
  DependInfo,
  DownloadOptions,
  DownloadProgress,
  DownloadResult,
  PublishItem,
  PublishOptions,
  PublishProgress,
  PublishResult,
} from "./client.js";
export { readInstalled } from "./installer.js";
export type { InstallOptions, InstallProgress, InstallAction, InstallResult, InstalledEntry, InstalledState } from "./installer.js";
export type { Requirement } from "./resolve.js";
export type { ManifestItem, PackageManifest } from "./extract.js";
export { createPackageRouter } from "./router.js";
export type { PackageRouter, PackageRouterOptions } from "./router.js";
export { servePackageRouter } from "./serve.js";
export type { PackageServer, ServePackageRouterOptions, FetchHandler } from "./serve.js";
export { bearerTokens } from "./auth.js";
export type { Authorize, AuthorizeContext, BearerTokensOptions, DepotAction, TokenScopes } from "./auth.js";
export { DEFAULT_LIMITS as DEFAULT_DEPOT_LIMITS } from "./transactions.js";
export type { DepotLimits, CommitProblem } from "./transactions.js";
export type { GarbageReport } from "./gc.js";
