/** `runner-depot publish` and `runner-depot install`: the depot client on the command line. */
import path from "node:path";
import { createDepotClient } from "../depot/index.js";
import { CliError, serverTarget, type Command } from "./args.js";
import { createProgress, formatBytes, type Progress } from "./progress.js";

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
${common}`;

const installUsage = `Usage: runner-depot install <name>[@range] <dir> [options]

Installs the newest version satisfying the range and all its dependencies into <dir>
(each package in <dir>/<name>), verifying every digest. An installed package is
upgraded through a delta when one is smaller.

Options:
  --force            reinstall packages already at the resolved version
${common}`;

const clientOptions = { url: { type: "string" }, token: { type: "string" }, data: { type: "string" } } as const;

export const publishCommand: Command = {
  usage: publishUsage,
  options: { ...clientOptions, require: { type: "string", multiple: true }, attr: { type: "string", multiple: true } },
  async run(values, positionals) {
    const [dir, spec] = positionals;
    if (!dir || !spec || positionals.length > 2) throw new CliError("give a directory and name@version: 'runner-depot publish ./dist mypkg@1.0.0'", 2);
    const at = spec.lastIndexOf("@");
    if (at <= 0) throw new CliError(`'${spec}' needs a version: name@version, e.g. mypkg@1.0.0`, 2);
    const requires = ((values.require as string[] | undefined) ?? []).map((req) => {
      const i = req.lastIndexOf("@");
      return i > 0 ? { name: req.slice(0, i), range: req.slice(i + 1) } : { name: req, range: "*" };
    });
    const attributes: Record<string, string> = {};
    for (const attr of (values.attr as string[] | undefined) ?? []) {
      const eq = attr.indexOf("=");
      if (eq <= 0) throw new CliError(`--attr '${attr}' must be key=value`, 2);
      attributes[attr.slice(0, eq)] = attr.slice(eq + 1);
    }
    const { url, token } = await serverTarget(values, "depotUrl");
    const client = createDepotClient({ baseUrl: url, token });
    const progress = createProgress("publish", "items");
    const result = await client.publish({
      name: spec.slice(0, at),
      version: spec.slice(at + 1),
      dir: path.resolve(dir),
      requires,
      attributes,
      onProgress: (p) => progress.update(p.item, p.items, { label: p.path ?? "", bytes: p.bytesSent }),
    }).catch((error: Error) => {
      progress.stop();
      throw new CliError(`publish failed: ${error.message}`);
    });
    progress.stop(
      `published ${result.name}@${result.version} (${result.digest}); ${formatBytes(result.bytesSent)} sent, ${result.byReference} file(s) by reference\n${result.url}`,
    );
    return 0;
  },
};

export const installCommand: Command = {
  usage: installUsage,
  options: { ...clientOptions, force: { type: "boolean" } },
  async run(values, positionals) {
    const [spec, dir] = positionals;
    if (!spec || !dir || positionals.length > 2) throw new CliError("give a package and a directory: 'runner-depot install mypkg@^1 ./vendor'", 2);
    const { url, token } = await serverTarget(values, "depotUrl");
    const client = createDepotClient({ baseUrl: url, token });
    // One bar per package download, so rate and ETA are that download's own.
    let current: { key: string; progress: Progress } | undefined;
    const result = await client.install(spec, path.resolve(dir), {
      force: values.force === true,
      onProgress: (event) => {
        if (event.phase !== "download") return;
        const key = `${event.name}@${event.version}${event.from ? ` (delta from ${event.from})` : ""}`;
        if (current?.key !== key) {
          current?.progress.stop();
          current = { key, progress: createProgress(`install ${key}`, "bytes") };
        }
        current.progress.update(event.received, event.total ?? event.received, { label: "", bytes: event.received });
      },
    }).catch((error: Error) => {
      current?.progress.stop();
      throw new CliError(`install failed: ${error.message}`);
    });
    current?.progress.stop();
    for (const pkg of result.packages) {
      const how = pkg.from ? ` from ${pkg.from}${pkg.via ? ` via ${pkg.via}` : ""}` : "";
      process.stderr.write(`${pkg.action} ${pkg.name}@${pkg.version}${how} (${formatBytes(pkg.bytes)})\n`);
    }
    return 0;
  },
};
