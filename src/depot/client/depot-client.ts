/**
 * The depot's HTTP client: the installer API (catalog with ETag caching, versions, depends, resumable
 * verified downloads, deltas) and the packager API (transactional publish that sends a file's bytes only when
 * the depot does not hold them yet). Web-standard `fetch` only, so any `fetch` (a proxy, a test double,
 * undici with a dispatcher) can be passed in.
 * Why: docs/decisions/depot-client.md, "depot-client.ts: the installer and packager client".
 */
import { Readable } from "node:stream";
import { isRunnerDepotError } from "../../errors.js";
import { createCatalogReader } from "./catalog.js";
import { createDepotConnection, seg, specPath, versionPart } from "./connection.js";
import { readLinkedPages } from "./linked-pages.js";
import { dependInfoOf } from "./depend-info.js";
import { downloadArchive } from "./download.js";
import { publishVersion } from "./publish.js";
import { attachSignature, describedContent, readAttestations, verifyAttestations } from "./attestations.js";
import type { DependInfo, DepotClient, DepotClientOptions, VersionInfo } from "./types.js";
import { sendYank, yankedReason } from "./yank.js";
import { readPackageManifest } from "../install/tar-entries.js";
import { installPackage } from "../install/installer.js";

export type * from "./types.js";
export { collectDirectory } from "./collect-directory.js";

/**
 * Creates a depot client.
 *
 * @example
 * const depot = createDepotClient({ baseUrl: "http://127.0.0.1:8080", token });
 * await depot.publish({ name: "tool", version: "1.0.0", dir: "./build", requires: { libc: "^2" } });
 * await depot.install("tool@^1", "/opt/pkgs");
 */
export function createDepotClient(options: DepotClientOptions): DepotClient {
  const connection = createDepotConnection(options);
  const { call } = connection;

  const client: DepotClient = {
    baseUrl: connection.base,

    catalog: createCatalogReader(connection),

    async versions(name) {
      // Paged on a depot of 0.3 or later (issue 30): every page, within the catalog's bounds.
      const relative = `version/${seg(versionPart(name).name)}`;
      const walk = await readLinkedPages<VersionInfo>(connection, relative, `GET /${relative}`);
      const pages = walk!.pages;
      return { ...pages.at(-1)!, versions: pages.flatMap((page) => page.versions) };
    },

    async depends(spec) {
      const { name, version } = versionPart(spec);
      const relative = `depend/${specPath(name, version)}`;
      const response = await call("GET", relative);
      if (!response.ok) throw await connection.error(response, `GET /${relative}`);
      const info = dependInfoOf(await connection.readJson<unknown>(response, `GET /${relative}`), `GET /${relative}`);
      const yanked = yankedReason(response.headers);
      return yanked === undefined ? info : { ...info, yanked };
    },

    async manifest(spec) {
      const { name, version } = versionPart(spec);
      const relative = `data/${specPath(name, version)}`;
      // The manifest is the archive's first entry: its head is usually enough.
      const head = await call("GET", relative, { headers: { range: "bytes=0-65535" } });
      if (!head.ok) throw await connection.error(head, `GET /${relative}`);
      // Each chunk within the idle bound and the whole within the JSON bound (a drip of a byte every 29 s would
      // otherwise hold it for weeks); the manifest's own size is bounded by readPackageManifest.
      const body = (response: Response) =>
        Readable.from(connection.chunks(response.body ?? new ReadableStream(), `GET /${relative}`, true));
      try {
        return await readPackageManifest(body(head));
      } catch (error) {
        // A head too short for the manifest is read again whole; a read that ran out of time is not given another.
        if (head.status !== 206 || (isRunnerDepotError(error) && error.code === "DEADLINE_EXCEEDED")) throw error;
      }
      const whole = await call("GET", relative);
      if (!whole.ok) throw await connection.error(whole, `GET /${relative}`);
      return readPackageManifest(body(whole));
    },

    download(spec, opts = {}) {
      return downloadArchive(connection, spec, opts);
    },

    async publish(p) {
      const result = await publishVersion(connection, p);
      if (p.sign) await client.sign(`${result.name}@${result.version}`, p.sign);
      return result;
    },

    attestations(spec) {
      return readAttestations(connection, spec);
    },

    async sign(spec, key) {
      return attachSignature(connection, await describedContent(connection, client.manifest, spec), key);
    },

    async verify(spec, policy) {
      return verifyAttestations(connection, await describedContent(connection, client.manifest, spec), policy);
    },

    yank(spec, reason) {
      return sendYank(connection, spec, reason);
    },

    unyank(spec) {
      return sendYank(connection, spec, null);
    },

    install(spec, targetDir, installOptions) {
      return installPackage(client, spec, targetDir, installOptions);
    },
  };
  return client;
}
