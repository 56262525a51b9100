/** `runner-depot publish` and `runner-depot install`: the depot client on the command line. */
import path from "node:path";
import { lstat } from "node:fs/promises";
import { createDepotClient, type PublishItem, type PublishProgress } from "../../depot/index.js";
import { collectDirectory } from "../../depot/client/depot-client.js";
import { isRunnerDepotError } from "../../errors.js";
import { answerTimeoutMs, CliError, countOption, serverTarget, type Command } from "../args.js";
import { cliFetch } from "../timed-fetch.js";
import {
  checkInstallSpec,
  checkSourceDir,
  checkTargetDir,
  parseAttributes,
  parsePublishSpec,
  parseRequires,
} from "./depot-inputs.js";
import { createProgress, formatBytes, type Progress } from "../progress.js";
import { policyFromOptions, readSigningKey, signatureOptions, signatureOptionsUsage } from "./signing.js";

const common = `  --url <url>        depot URL (default: from <data>/serve.json)
  --token <token>    bearer token (default: $RUNNER_DEPOT_TOKEN or <data>/serve.json)
  --data <dir>       where 'serve' keeps its data (default ./.runner-depot)`;

const publishUsage = `Usage: runner-depot publish <dir> <name>@<version> [options]

Publishes every file, directory and symbolic link under <dir> as one package version,
in one transaction that appears atomically (or not at all). Files the depot already
holds are sent by reference, not uploaded again.

Options:
  --require <name@range>   a dependency (repeatable), e.g. --require libfoo@^1.2
  --attr <key=value>       a package attribute (repeatable), e.g. --attr description=…
  --sign-key <file>        sign the version with this key ('runner-depot keys generate');
                           the depot must trust it
${common}`;

const installUsage = `Usage: runner-depot install <name>[@range] <dir> [options]

Installs the newest version satisfying the range and all its dependencies into <dir>
(each package in <dir>/<name>), verifying every digest. An installed package is
upgraded through a delta when one is smaller. Installs never delete your files: what
an install wrote is recorded in <dir>/.runner-depot/records/, and anything else in a
package's folder is kept (or the install refuses, see --preserve).

Options:
  --force            reinstall packages already at the resolved version
  --preserve <mode>  where the new version has a file you added or edited since the
                     install wrote it: 'refuse' (default: stop, change nothing) or
                     'renameold' (keep yours as <path>.old). Your other files are kept.
  --max-versions-tried <n>  give up resolving after trying this many candidate versions
                     (default 10000)
  --max-requirements <n>    give up after examining this many requirements (default 200000)
${signatureOptionsUsage}
${common}`;

const clientOptions = { url: { type: "string" }, token: { type: "string" }, data: { type: "string" } } as const;

export const publishCommand: Command = {
  usage: publishUsage,
  options: {
    ...clientOptions,
    require: { type: "string", multiple: true },
    attr: { type: "string", multiple: true },
    "sign-key": { type: "string" },
  },
  async run(values, positionals) {
    const [dir, spec] = positionals;
    if (!dir || !spec || positionals.length > 2)
      throw new CliError("give a directory and name@version: 'runner-depot publish ./dist mypkg@1.0.0'", 2);
    // Every input is checked before the first request: nothing half-uploaded on a typo.
    const { name, version } = parsePublishSpec(spec);
    const requires = parseRequires((values.require as string[] | undefined) ?? []);
    const attributes = parseAttributes((values.attr as string[] | undefined) ?? []);
    const source = await checkSourceDir(dir);
    const signKey = values["sign-key"] as string | undefined;
    const sign = signKey !== undefined ? await readSigningKey(signKey) : undefined;
    const { url, token } = await serverTarget(values, "depotUrl");
    const client = createDepotClient({ baseUrl: url, token, fetch: cliFetch });
    const { items, bytes } = await publishItems(source);
    const progress = createProgress(`publish ${name}@${version}`);
    const count = countPublished(bytes);
    const result = await client
      .publish({
        name,
        version,
        items,
        requires,
        attributes,
        ...(sign ? { sign } : {}),
        onProgress: (p) => progress.update(count(p), count.total),
      })
      .catch((error: Error) => {
        progress.stop();
        throw new CliError(`publish failed: ${error.message}`);
      });
    progress.stop(
      `published ${result.name}@${result.version} (${result.digest}); ${formatBytes(result.bytesSent)} sent, ${result.byReference} file(s) by reference\n${result.url}`,
    );
    return 0;
  },
};

/** The folder's items, with each file's size: the bar counts bytes, not items. */
async function publishItems(dir: string): Promise<{ items: PublishItem[]; bytes: Map<string, number> }> {
  const items = await collectDirectory(dir);
  const bytes = new Map<string, number>();
  for (const item of items) if (item.type === "file" && item.file) bytes.set(item.path, (await lstat(item.file)).size);
  return { items, bytes };
}

/**
 * Bytes of the package done so far from the client's publish progress: the sizes of the
 * files finished (uploaded or taken by reference) plus the bytes of uploads under way.
 * Monotonic, at most the total.
 */
function countPublished(bytes: Map<string, number>): ((p: PublishProgress) => number) & { total: number } {
  let finished = 0;
  let finishedBytes = 0;
  let sentInFinished = 0;
  let byReference = 0;
  let shown = 0;
  const total = [...bytes.values()].reduce((a, b) => a + b, 0);
  const count = (p: PublishProgress) => {
    if (p.item > finished) {
      // An item just finished: p.path is it. Sent bytes were its upload unless it went by reference.
      finished = p.item;
      const size = p.path !== undefined ? (bytes.get(p.path) ?? 0) : 0;
      finishedBytes += size;
      if (p.byReference === byReference) sentInFinished += size;
      byReference = p.byReference;
    }
    shown = Math.min(total, Math.max(shown, finishedBytes + Math.max(0, p.bytesSent - sentInFinished)));
    return shown;
  };
  return Object.assign(count, { total });
}

/** The flag that raises each resolver limit (the `details.limit` of a give-up). */
const LIMIT_FLAGS = new Map<unknown, string>([
  ["maxSteps", "--max-versions-tried"],
  ["maxRequirements", "--max-requirements"],
]);

export const installCommand: Command = {
  usage: installUsage,
  options: {
    ...clientOptions,
    force: { type: "boolean" },
    preserve: { type: "string" },
    "max-versions-tried": { type: "string" },
    "max-requirements": { type: "string" },
    ...signatureOptions,
  },
  async run(values, positionals) {
    const [spec, dir] = positionals;
    if (!spec || !dir || positionals.length > 2)
      throw new CliError("give a package and a directory: 'runner-depot install mypkg@^1 ./vendor'", 2);
    checkInstallSpec(spec);
    const preserve = values.preserve ?? "refuse";
    if (preserve !== "refuse" && preserve !== "renameold")
      throw new CliError(`--preserve must be 'refuse' or 'renameold', got '${String(preserve)}'`, 2);
    const resolveLimits = {
      maxSteps: countOption(values["max-versions-tried"], "max-versions-tried"),
      maxRequirements: countOption(values["max-requirements"], "max-requirements"),
    };
    const target = await checkTargetDir(dir);
    const signatures = await policyFromOptions(values, "ignore");
    const { url, token } = await serverTarget(values, "depotUrl");
    // $RUNNER_DEPOT_TIMEOUT bounds the bodies too: the idle time between chunks, and a JSON answer in all.
    const timeout = answerTimeoutMs();
    const client = createDepotClient({
      baseUrl: url,
      token,
      fetch: cliFetch,
      idleTimeoutMs: timeout,
      jsonTimeoutMs: timeout,
    });
    // One bar per package download, so rate and ETA are that download's own.
    let current: { key: string; progress: Progress } | undefined;
    const result = await client
      .install(spec, target, {
        force: values.force === true,
        preserve,
        signatures,
        resolveLimits,
        onProgress: (event) => {
          if (event.phase !== "download") return;
          const key = `${event.name}@${event.version}${event.from ? ` (delta from ${event.from})` : ""}`;
          if (current?.key !== key) {
            current?.progress.stop();
            current = { key, progress: createProgress(`install ${key}`) };
          }
          current.progress.update(event.received, event.total);
        },
      })
      .catch((error: Error) => {
        current?.progress.stop();
        if (isRunnerDepotError(error) && error.code === "CONFLICT" && Array.isArray(error.details.paths)) {
          const paths = error.details.paths as string[];
          const shown = paths
            .slice(0, 5)
            .map((p) => path.join(dir, p))
            .join(", ");
          throw new CliError(
            `install refused: it would replace ${paths.length} file(s) you added or changed: ${shown}${paths.length > 5 ? ` and ${paths.length - 5} more` : ""}; nothing was changed. Move them away, or pass --preserve renameold to keep each as <file>.old`,
          );
        }
        const flag = isRunnerDepotError(error, "DEPENDENCY_CONFLICT")
          ? LIMIT_FLAGS.get(error.details.limit)
          : undefined;
        throw new CliError(`install failed: ${error.message}${flag ? ` (raise it with ${flag})` : ""}`);
      });
    current?.progress.stop();
    for (const pkg of result.packages) {
      const how = pkg.from ? ` from ${pkg.from}${pkg.via ? ` via ${pkg.via}` : ""}` : "";
      process.stderr.write(`${pkg.action} ${pkg.name}@${pkg.version}${how} (${formatBytes(pkg.bytes)})\n`);
      for (const a of pkg.verified ?? [])
        process.stderr.write(`  signed by ${a.keyName ?? a.keyId}${a.builderId ? `, built by ${a.builderId}` : ""}\n`);
      if (pkg.kept && pkg.kept.length > 0) {
        const more = pkg.kept.length > 5 ? ` and ${pkg.kept.length - 5} more` : "";
        process.stderr.write(
          `  kept your ${pkg.kept
            .slice(0, 5)
            .map((p) => path.join(dir, p))
            .join(", ")}${more}\n`,
        );
      }
    }
    return 0;
  },
};
