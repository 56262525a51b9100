/**
 * The client's side of signed versions: reading a version's attestations, signing a
 * published version (a DSSE envelope of an in-toto statement in a Sigstore bundle), and
 * verifying a version's attestations under a signature policy.
 * Why: docs/decisions/signed-versions.md.
 */
import { RunnerDepotError } from "../../errors.js";
import type { PackageManifest } from "../install/manifest.js";
import { signBundle, type SigstoreBundle } from "../signing/bundle.js";
import type { SigningKey } from "../signing/keys.js";
import { signedVersionStatement, type VersionContent } from "../signing/statement.js";
import { loadPolicy, verifyVersion, type SignaturePolicy, type VerifiedAttestation } from "../signing/verify.js";
import { specPath, versionPart, type DepotConnection } from "./connection.js";
import type { AttestationList, VersionInfo } from "./types.js";

/** The bound on a `GET /attestations` answer: 16 bundles of the depot's default 16 MiB, and room. */
const MAX_ATTESTATION_LIST_BYTES = 16 * 16 * 2 ** 20 + 2 ** 20;

/** `name@version` split, the version required. */
function exactSpec(spec: string): { name: string; version: string } {
  const { name, version } = versionPart(spec);
  if (version === undefined) throw new RunnerDepotError("VERSION_INVALID", `${spec}: give name@version`);
  return { name, version };
}

/** `GET /attestations/<name>@<version>`; a depot without the route (404 NOT_FOUND) answers none. */
export async function readAttestations(connection: DepotConnection, spec: string): Promise<AttestationList> {
  const { name, version } = exactSpec(spec);
  const relative = `attestations/${specPath(name, version)}`;
  const response = await connection.call("GET", relative);
  if (!response.ok) {
    const error = await connection.error(response, `GET /${relative}`);
    // A depot older than issue 26 has no such route: its versions are unsigned.
    if (error.code === "NOT_FOUND") return { name, version, attestations: [] };
    throw error;
  }
  const bytes = await connection.readBytes(response, `GET /${relative}`, MAX_ATTESTATION_LIST_BYTES);
  return JSON.parse(bytes.toString("utf8")) as AttestationList;
}

/** A version's content as the depot describes it: `/version`'s digest and the manifest's files. */
export async function describedContent(
  connection: DepotConnection,
  manifest: (spec: string) => Promise<PackageManifest>,
  spec: string,
): Promise<VersionContent> {
  const { name, version } = exactSpec(spec);
  const info = await connection.json<VersionInfo>("GET", `version/${specPath(name, version)}`);
  const entry = info.versions.find((v) => v.version === version);
  if (!entry) throw new RunnerDepotError("VERSION_NOT_FOUND", `No version ${version} of ${name}`);
  return contentOf(name, version, entry.digest, (await manifest(spec)).items);
}

/** The content statements name, from a manifest's items. O(items). */
export function contentOf(
  name: string,
  version: string,
  digest: string,
  items: PackageManifest["items"],
): VersionContent {
  return {
    name,
    version,
    digest,
    files: items.flatMap((item) =>
      item.type === "file" && item.digest ? [{ path: item.path, digest: item.digest }] : [],
    ),
  };
}

/**
 * Signs `content` with `key` and attaches the bundle to its version (`POST /attestations`).
 *
 * @example
 * const bundle = await attachSignature(connection, content, signingKeyFromPem(pem));
 */
export async function attachSignature(
  connection: DepotConnection,
  content: VersionContent,
  key: SigningKey,
  now = new Date(),
): Promise<SigstoreBundle> {
  const statement = signedVersionStatement(content, now);
  const bundle = signBundle(Buffer.from(JSON.stringify(statement)), key);
  const relative = `attestations/${specPath(content.name, content.version)}`;
  const response = await connection.call("POST", relative, {
    headers: { "content-type": "application/json" },
    body: JSON.stringify(bundle),
  });
  if (!response.ok) throw await connection.error(response, `POST /${relative}`);
  await response.body?.cancel();
  return bundle;
}

/**
 * Verifies a version's attestations under `policy`: what held, or the refusal naming the
 * package, the version and the reason.
 */
export async function verifyAttestations(
  connection: DepotConnection,
  content: VersionContent,
  policy: SignaturePolicy,
): Promise<VerifiedAttestation[]> {
  const loaded = loadPolicy(policy);
  if (loaded.policy === "ignore") return [];
  const list = await readAttestations(connection, `${content.name}@${content.version}`);
  return verifyVersion(
    content,
    list.attestations.map((a) => a.bundle),
    loaded,
  );
}
