/**
 * System programs a benchmark measures against (its peers, e.g. nginx). A benchmark never
 * changes the machine on its own: a missing peer is installed with apt-get only when the
 * run was asked to (`npm run bench -- --install-peers`, which bench/run.ts passes to each
 * module's `run({ installPeers })`); otherwise the module is told what is missing, says
 * so, and leaves out the rows that needed it.
 */
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { promisify } from "node:util";

const run = promisify(execFile);

/** A peer program: where it lives once installed, and the Debian package that has it. */
export interface SystemPeer {
  name: string;
  bin: string;
  aptPackage: string;
  /** The bench module that needs it, for the message (`npm run bench -- <module>`). */
  module: string;
}

/**
 * null when `peer` is there (installing it first if `installPeers`), else one line that
 * says what is missing and how to get it.
 * @example
 * const missing = await peerMissing({ name: "nginx", bin: "/usr/sbin/nginx", aptPackage: "nginx", module: "depot" }, options.installPeers === true);
 * if (missing) console.error(`bench depot: skipping the rows against nginx: ${missing}`);
 */
export async function peerMissing(peer: SystemPeer, installPeers: boolean): Promise<string | null> {
  if (existsSync(peer.bin)) return null;
  if (!installPeers) {
    return `${peer.name} is not installed (\`apt-get install ${peer.aptPackage}\`, or \`npm run bench -- ${peer.module} --install-peers\` to let the bench install it)`;
  }
  console.error(`bench ${peer.module}: --install-peers: installing ${peer.aptPackage} with apt-get…`);
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
  const maxBuffer = 64 * 2 ** 20;
  try {
    await run("apt-get", ["update"], { env, maxBuffer });
    await run("apt-get", ["install", "-y", "--no-install-recommends", peer.aptPackage], { env, maxBuffer });
  } catch (error) {
    return `apt-get install ${peer.aptPackage} failed: ${(error as Error).message.split("\n")[0]}`;
  }
  return existsSync(peer.bin) ? null : `apt-get install ${peer.aptPackage} did not provide ${peer.bin}`;
}
