/**
 * A version's attestations (docs/depot-api.md §Attestations): `POST /attestations/<pkg>@<version>`
 * takes a Sigstore bundle signed by a key the depot trusts over exactly that version's
 * content; `GET` lists them with their bundles.
 */
import type { IRequest } from "itty-router";
import { RunnerDepotError } from "../../errors.js";
import { boundedRequestBody } from "./bounded-body.js";
import { readBlobWhole } from "../store/blob-read.js";
import { parsePackageRef } from "../package/names.js";
import { addAttestation, listAttestations, versionContent } from "../store/attestations.js";
import { verifySigner } from "../signing/verify.js";
import { checkSubjects } from "../signing/statement.js";
import type { LoadedKey } from "../signing/keys.js";
import { json } from "./problem-response.js";
import { getAndHead, type RouterContext } from "./router-context.js";

/** Settings of the attestation routes. */
export interface AttestationSettings {
  /** The keys whose signatures the depot takes; none: every attestation is refused (KEY_UNTRUSTED). */
  keys: Map<string, LoadedKey>;
  /** The largest bundle taken, bytes. */
  maxBytes: number;
}

/** Registers `GET|HEAD|POST /attestations/<pkg>@<version>`. */
export function registerAttestationRoutes(context: RouterContext, settings: AttestationSettings): void {
  const { router, store, now, log, principalOf, publishedVersion } = context;

  const specOf = (request: IRequest) => {
    const ref = parsePackageRef(request.params.pkg!);
    if (ref.version === undefined)
      throw new RunnerDepotError("VERSION_INVALID", "/attestations/<name>@<version> needs the version");
    return { name: ref.name, version: ref.version };
  };

  router.post("/attestations/:pkg", async (request) => {
    const { name, version } = specOf(request);
    // Auth before a byte of the body is read; the body is bounded before it is parsed.
    await principalOf(request, "publish", name);
    const record = await publishedVersion(name, version);
    const bytes = await boundedRequestBody(request, "an attestation", settings.maxBytes);
    if (bytes === null) throw new RunnerDepotError("ATTESTATION_INVALID", "no body");
    let bundle: unknown;
    try {
      // JSON is UTF-8 (RFC 8259): other bytes are refused, not replaced.
      bundle = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
    } catch {
      throw new RunnerDepotError("ATTESTATION_INVALID", "the body is not JSON in UTF-8");
    }
    // The signer first (O(bundle)): a bundle by a key the depot does not trust costs no manifest read. Then the
    // subjects, O(items): the version's manifest is read to check every file's.
    const { held, statement } = verifySigner(bundle, { name, version }, settings.keys, now());
    checkSubjects(statement, await versionContent(store, record));
    // Stored as rebuilt from its signed parts: a replayed copy, re-spaced or padded, is the same attestation.
    const { entry, created } = await addAttestation(store, record, bundle, held, now());
    if (created) log.info({ name, version, keyId: entry.keyId, predicateType: entry.predicateType }, "attested");
    return json(created ? 201 : 200, { name, version, ...entry });
  });

  getAndHead(router, "/attestations/:pkg", async (request) => {
    const { name, version } = specOf(request);
    await principalOf(request, "read", name);
    await publishedVersion(name, version);
    const entries = await listAttestations(store, name, version);
    // At most MAX_ATTESTATIONS bundles, MAX_ATTESTATION_BYTES of them in all (addAttestation).
    const attestations = await Promise.all(
      entries.map(async (entry) => {
        // Read within the size the entry records (the store is asked for no more than the depot stored).
        const bytes = await readBlobWhole(store, entry.digest, entry.size);
        if (!bytes) throw new RunnerDepotError("INTERNAL", `attestation ${entry.digest} of ${name}@${version} is gone`);
        return { ...entry, bundle: JSON.parse(bytes.toString("utf8")) as unknown };
      }),
    );
    return json(200, { name, version, attestations });
  });
}
