/**
 * Signed versions on the command line (issue 26): `runner-depot keys generate`, `runner-depot
 * verify <pkg>@<version>`, and the key and policy options `publish`, `install` and `serve` share.
 */
import { mkdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { createDepotClient } from "../../depot/index.js";
import { SIGNED_VERSION_PREDICATE } from "../../depot/signing/statement.js";
import {
  generateSigningKey,
  loadTrustedKeys,
  signingKeyFromPem,
  trustedKeyEntry,
  type SigningKey,
  type TrustedKeySet,
} from "../../depot/signing/keys.js";
import type { SignaturePolicy, SignaturePolicyMode } from "../../depot/signing/verify.js";
import { CliError, serverTarget, type Command } from "../args.js";
import { cliFetch } from "../timed-fetch.js";

/** A key or trust file is read whole: a bound on what a typo'd path can make us read. */
const MAX_KEY_FILE_BYTES = 4 * 2 ** 20;

async function readSmallFile(file: string, what: string): Promise<string> {
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (error) {
    throw new CliError(`cannot read ${what} ${file}: ${(error as Error).message}`, 2);
  }
  if (Buffer.byteLength(text) > MAX_KEY_FILE_BYTES) throw new CliError(`${what} ${file} is too large`, 2);
  return text;
}

/** `--sign-key <file>`: the private key PEM `keys generate` wrote. */
export async function readSigningKey(file: string): Promise<SigningKey> {
  try {
    return signingKeyFromPem(await readSmallFile(file, "signing key"));
  } catch (error) {
    throw new CliError(`--sign-key ${file}: ${(error as Error).message}`, 2);
  }
}

/** `--trusted-keys <file>`: `{ "keys": [...] }`, every key checked now. */
export async function readTrustedKeys(file: string): Promise<TrustedKeySet> {
  const text = await readSmallFile(file, "trusted keys");
  try {
    const set = JSON.parse(text) as TrustedKeySet;
    loadTrustedKeys(set);
    return set;
  } catch (error) {
    throw new CliError(`--trusted-keys ${file}: ${(error as Error).message}`, 2);
  }
}

/** `--signatures <mode>` with `--trusted-keys` and `--builder`, as the installer and `verify` take them. */
export async function policyFromOptions(
  values: Record<string, unknown>,
  fallback: SignaturePolicyMode,
): Promise<SignaturePolicy> {
  const mode = (values.signatures as string | undefined) ?? fallback;
  if (mode !== "ignore" && mode !== "verify" && mode !== "require")
    throw new CliError(`--signatures must be ignore, verify or require, got '${mode}'`, 2);
  const file = values["trusted-keys"] as string | undefined;
  if (mode !== "ignore" && file === undefined)
    throw new CliError(`--signatures ${mode} needs --trusted-keys <file>`, 2);
  const builders = (values.builder as string[] | undefined) ?? [];
  return {
    policy: mode,
    ...(file !== undefined ? { trustedKeys: await readTrustedKeys(file) } : {}),
    ...(builders.length > 0 ? { builders } : {}),
  };
}

export const signatureOptionsUsage = `  --signatures <policy>     ignore (default), verify (every signature present must hold)
                            or require (and there must be one)
  --trusted-keys <file>     the keys trusted: { "keys": [ { keyId, publicKey, name?,
                            validFrom?, validUntil?, revokedAt? } ] }
  --builder <id>            require provenance from this builder (repeatable)`;

export const signatureOptions = {
  signatures: { type: "string" },
  "trusted-keys": { type: "string" },
  builder: { type: "string", multiple: true },
} as const;

/**
 * The orchestrator's signing key under `dataDir` (`orchestrator.key`, 0600), made on first
 * use like the job secret, with its trusted-keys entry beside it (`orchestrator-key.json`)
 * for installers to pass as `--trusted-keys`.
 */
export async function orchestratorSigningKey(dataDir: string): Promise<SigningKey> {
  const file = path.join(dataDir, "orchestrator.key");
  try {
    return signingKeyFromPem(await readFile(file, "utf8"));
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
  }
  const generated = generateSigningKey();
  await writeFile(file, generated.privateKey, { mode: 0o600, flag: "wx" });
  const entry = trustedKeyEntry(generated, "orchestrator", new Date().toISOString());
  await writeFile(path.join(dataDir, "orchestrator-key.json"), `${JSON.stringify({ keys: [entry] }, null, 2)}\n`);
  return signingKeyFromPem(generated.privateKey);
}

const keysUsage = `Usage: runner-depot keys generate [--out <dir>] [--name <name>]

Generates an Ed25519 signing key: writes <dir>/<keyId>.key (the private key, mode 0600)
and <dir>/<keyId>.pub, and prints the entry to add to a trusted-keys file (the depot's
'serve --trusted-keys', an installer's 'install --trusted-keys'). Rotate by adding a new
key and giving the old one a validUntil; revoke a leaked one with revokedAt.

Options:
  --out <dir>    where to write the key files (default .)
  --name <name>  a name for people, kept in the trusted-keys entry`;

export const keysCommand: Command = {
  usage: keysUsage,
  options: { out: { type: "string" }, name: { type: "string" } },
  async run(values, positionals) {
    if (positionals[0] !== "generate" || positionals.length > 1)
      throw new CliError("the keys command is 'runner-depot keys generate [--out <dir>]'", 2);
    const dir = (values.out as string | undefined) ?? ".";
    await mkdir(dir, { recursive: true });
    const generated = generateSigningKey();
    const keyFile = path.join(dir, `${generated.keyId}.key`);
    await writeFile(keyFile, generated.privateKey, { mode: 0o600, flag: "wx" });
    await writeFile(path.join(dir, `${generated.keyId}.pub`), generated.publicKey, { flag: "wx" });
    const entry = trustedKeyEntry(generated, values.name as string | undefined, new Date().toISOString());
    process.stdout.write(`${JSON.stringify(entry, null, 2)}\n`);
    process.stderr.write(`wrote ${keyFile} (keep it secret) and its .pub; key ID ${generated.keyId}\n`);
    return 0;
  },
};

const verifyUsage = `Usage: runner-depot verify <name>@<version> --trusted-keys <file> [options]

Checks a version's signatures and provenance against the keys you trust, and prints who
signed what. Exits 1 naming the package, the version and the reason when a signature
does not hold (or, under --signatures require, when there is none).

Options:
${signatureOptionsUsage.replace("ignore (default), verify", "ignore, verify (default)")}
  --url <url>        depot URL (default: from <data>/serve.json)
  --token <token>    bearer token (default: $RUNNER_DEPOT_TOKEN or <data>/serve.json)
  --data <dir>       where 'serve' keeps its data (default ./.runner-depot)`;

export const verifyCommand: Command = {
  usage: verifyUsage,
  options: { url: { type: "string" }, token: { type: "string" }, data: { type: "string" }, ...signatureOptions },
  async run(values, positionals) {
    const [spec] = positionals;
    if (!spec || positionals.length > 1 || !/^[^@]+@[^@]+$/.test(spec))
      throw new CliError("give one name@version: 'runner-depot verify mypkg@1.0.0 --trusted-keys keys.json'", 2);
    const policy = await policyFromOptions(values, "verify");
    const { url, token } = await serverTarget(values, "depotUrl");
    const client = createDepotClient({ baseUrl: url, token, fetch: cliFetch });
    const held = await client.verify(spec, policy).catch((error: Error) => {
      throw new CliError(`verify refused: ${error.message}`);
    });
    if (held.length === 0) process.stdout.write(`${spec}: unsigned (accepted under --signatures ${policy.policy})\n`);
    for (const a of held) {
      const who = a.keyName ? `${a.keyName} (${a.keyId})` : a.keyId;
      const what =
        a.predicateType === SIGNED_VERSION_PREDICATE
          ? "signed the archive and every file"
          : `attested provenance: built by ${a.builderId}${a.requestId ? ` in job ${a.requestId}` : ""}`;
      process.stdout.write(`${spec}: ${who} ${what}, at ${a.signedAt}\n`);
    }
    return 0;
  },
};
