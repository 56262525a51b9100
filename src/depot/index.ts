/** runner-depot/depot: the package depot (router, server, client, installer). */
export type * from "./ports.js";
export { composeStore } from "./compose.js";
export type { ComposeStoreOptions } from "./compose.js";
export { createDepotClient, collectDirectory } from "./client.js";
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
export { installPackage, readInstalled, STATE_DIR } from "./installer.js";
export type { InstallOptions, InstallProgress, InstallAction, InstallResult, InstalledEntry, InstalledState } from "./installer.js";
export { resolveDependencies, parsePackageSpec, satisfyingVersions } from "./resolve.js";
export type { DependencySource, Requirement, ResolvedPackage, Resolution, ResolveOptions } from "./resolve.js";
export { extractPackage, readPackageManifest, verifyPackageTree, checkPackagePath, checkLinkTarget, MANIFEST_PATH } from "./extract.js";
export type { ExtractOptions, ManifestItem, PackageManifest, VerifyTreeOptions } from "./extract.js";
export { createPackageRouter } from "./router.js";
export type { PackageRouter, PackageRouterOptions } from "./router.js";
export { servePackageRouter } from "./serve.js";
export type { PackageServer, ServePackageRouterOptions, FetchHandler } from "./serve.js";
export { bearerTokens, namePattern } from "./auth.js";
export type { Authorize, AuthorizeContext, BearerTokensOptions, DepotAction, TokenScopes } from "./auth.js";
export { DEFAULT_LIMITS } from "./transactions.js";
export type { DepotLimits, CommitProblem } from "./transactions.js";
export type { GarbageReport } from "./gc.js";
