/**
 * The installer's public types: its options, progress events and outcome. Apart from
 * depot/install/installer.ts so that the client's interface (client-types.ts), which offers `install`,
 * and the installer, which drives the client, both name them without importing each other.
 */
import type { PreserveMode } from "./preserve.js";
import type { SignaturePolicy } from "../signing/verify.js";
import type { ResolveOptions } from "./resolve.js";

/** Installer progress events. */
export type InstallProgress =
  | { phase: "resolved"; packages: Array<{ name: string; version: string }> }
  | { phase: "download"; name: string; version: string; from?: string; received: number; total?: number }
  | { phase: "fallback"; name: string; version: string; from: string; reason: string }
  | { phase: "staged"; name: string; version: string; via: "full" | "delta" }
  | { phase: "done" };

/** Options of {@link DepotClient.install}. */
export interface InstallOptions {
  onProgress?: (event: InstallProgress) => void;
  /** Upgrade installed packages through deltas. Default true. */
  delta?: boolean;
  /** Reinstall packages already at the resolved version. Default false. */
  force?: boolean;
  /**
   * What to do when the new version has an entry where a file the install did not
   * write, or one changed since, sits: `refuse` (default; CONFLICT naming them, nothing
   * changed) or `renameold` (keep it as `<path>.old`). Such files elsewhere are always kept.
   */
  preserve?: PreserveMode;
  /**
   * The signature policy every package installed is checked under, after its bytes are
   * checked against its manifest and before anything is swapped in (default `ignore`).
   */
  signatures?: SignaturePolicy;
  /**
   * How much work resolving the dependencies may take before it gives up (DEPENDENCY_CONFLICT): candidate versions
   * tried (`maxSteps`, default 10,000) and requirements examined (`maxRequirements`, default 200,000). Raise them for
   * a graph larger than that; they also bound what a hostile depot's answers can cost.
   */
  resolveLimits?: ResolveOptions;
}

/** What happened to one package. */
export interface InstallAction {
  name: string;
  version: string;
  action: "installed" | "upgraded" | "downgraded" | "reinstalled" | "unchanged";
  from?: string;
  via?: "full" | "delta";
  /** Archive bytes downloaded for it. */
  bytes: number;
  /** The attestations that held under the install's signature policy. */
  verified?: Array<{ keyId: string; keyName?: string; predicateType: string; builderId?: string }>;
  /** The user's entries kept in its folder (paths under the target; `.old` ones renamed under `renameold`). */
  kept?: string[];
}

/** The outcome of an install. */
export interface InstallResult {
  root: { name: string; version: string };
  packages: InstallAction[];
}
