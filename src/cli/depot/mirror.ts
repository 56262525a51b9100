/** `runner-depot mirror <upstream>`: copies an upstream depot into the depot store under --data (or PostgreSQL + S3). */
import { mkdir } from "node:fs/promises";
import path from "node:path";
import { mirrorDepot } from "../../depot/mirror/mirror.js";
import { CliError, DEFAULT_DATA_DIR, type Command } from "../args.js";
import { policyFromOptions, signatureOptions } from "./signing.js";
import { openPackageStore, packageStoreOptions, PACKAGE_STORE_USAGE } from "./package-store-options.js";

const usage = `Usage: runner-depot mirror <upstream-url> [options]

Copies every version (its items, only the bytes this store lacks), every yank and every
attestation of the depot at <upstream-url> into the depot store (under --data, or the
PostgreSQL records and S3 blobs the store flags name, as 'serve' takes them), following
the upstream's change feed from where the last run stopped. Each version's archive is
rebuilt here and checked against the upstream's digest before it becomes visible; each
attestation's subjects are checked against the content copied here before it is stored. A run killed anywhere
resumes without duplicates. A version whose manifest breaks a publish rule or limit (the
default limits) is not copied: its line says "refused" with the reason, and the run goes on.
'runner-depot serve' with the same store flags serves the copy.

Options:
  --data <dir>          data directory (default ./${DEFAULT_DATA_DIR}); the store is <dir>/depot
  --token <token>       bearer token with read on the upstream (default: $RUNNER_DEPOT_UPSTREAM_TOKEN)
  --follow              keep following the upstream until SIGINT/SIGTERM
  --interval <seconds>  the wait between polls with --follow (default 5)
  --signatures <policy> ignore: attestations copied with their subjects checked; verify
                        (the default with --trusted-keys): each copied must be signed by
                        one of the trusted keys; require: and a version is copied only
                        once it carries one (an unsigned version waits for its signature)
  --trusted-keys <file> the keys trusted (a 'runner-depot keys generate' set)
  --builder <id>        with verify or require, a version must carry provenance from this
                        builder (repeatable)
${PACKAGE_STORE_USAGE}`;

export const mirrorCommand: Command = {
  usage,
  options: {
    data: { type: "string" },
    token: { type: "string" },
    follow: { type: "boolean" },
    interval: { type: "string" },
    ...signatureOptions,
    ...packageStoreOptions,
  },
  async run(values, positionals) {
    const [upstream] = positionals;
    if (!upstream || positionals.length > 1)
      throw new CliError("give one upstream URL: 'runner-depot mirror https://depot.example.com'", 2);
    let url: URL;
    try {
      url = new URL(upstream);
    } catch {
      throw new CliError(`'${upstream}' is not a URL`, 2);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:")
      throw new CliError(`the upstream must be http or https, not ${url.protocol}`, 2);
    const interval = values.interval === undefined ? 5 : Number(values.interval);
    if (!Number.isFinite(interval) || interval < 0.1 || interval > 86_400)
      throw new CliError("--interval takes seconds from 0.1 to 86400", 2);
    const signatures = await policyFromOptions(values, values["trusted-keys"] !== undefined ? "verify" : "ignore");
    const dataDir = path.resolve(typeof values.data === "string" ? values.data : DEFAULT_DATA_DIR);
    await mkdir(path.join(dataDir, "depot"), { recursive: true });
    const store = await openPackageStore(values, dataDir);
    const stop = new AbortController();
    const onSignal = () => stop.abort();
    process.once("SIGINT", onSignal);
    process.once("SIGTERM", onSignal);
    try {
      const report = await mirrorDepot(store, {
        upstream: url.href,
        token: typeof values.token === "string" ? values.token : process.env.RUNNER_DEPOT_UPSTREAM_TOKEN,
        follow: values.follow === true,
        intervalMs: interval * 1000,
        signatures,
        signal: stop.signal,
        onChange: (change, outcome, refusal) => {
          const { position, name, version } = change;
          const line = { position, name, version, outcome, ...(refusal ? { reason: refusal.reason } : {}) };
          process.stdout.write(`${JSON.stringify(line)}\n`);
        },
      });
      process.stderr.write(
        `mirrored ${url.href} through position ${report.position}: ${report.copied} copied, ${report.present} present, ${report.yanks} yanks, ${report.attestations} attestations, ${report.removed} removed, ${report.deferred} deferred (unsigned), ${report.refusedCount} refused (a publish rule), ${report.bytesFetched} bytes fetched, ${report.blobsReused} blobs reused\n`,
      );
      return 0;
    } finally {
      process.off("SIGINT", onSignal);
      process.off("SIGTERM", onSignal);
      await store.close?.();
    }
  },
};
