/**
 * The in-toto Statement v1 a version's signature covers: its subjects (the archive's
 * digest, then each file's), with either the depot's signed-version predicate or a SLSA
 * Provenance v1 predicate from the orchestrator; and the check that a statement's subjects
 * are exactly a given version's content, naming the first file that differs.
 */
import { RunnerDepotError } from "../../errors.js";

export const STATEMENT_TYPE = "https://in-toto.io/Statement/v1";
/** The predicate of a publisher's signature: "I vouch for this version's content". */
export const SIGNED_VERSION_PREDICATE = "urn:runner-depot:predicate:signed-version:v1";
export const SLSA_PROVENANCE_PREDICATE = "https://slsa.dev/provenance/v1";

/** One in-toto subject: a name and its SHA-256 (hex). */
export interface Subject {
  name: string;
  digest: { sha256: string };
}

/** An in-toto Statement v1. */
export interface Statement {
  _type: typeof STATEMENT_TYPE;
  subject: Subject[];
  predicateType: string;
  predicate: Record<string, unknown>;
}

/** A file of a version: its path in the package and its `sha256:<hex>` digest. */
export interface VersionFile {
  path: string;
  digest: string;
}

/** What a statement is about: one version's archive and files. */
export interface VersionContent {
  name: string;
  version: string;
  /** The archive's `sha256:<hex>`. */
  digest: string;
  files: readonly VersionFile[];
}

const hexOf = (digest: string) => digest.replace(/^sha256:/, "");

/** The subjects of a version: the archive as `<name>@<version>`, each file as `<name>@<version>/<path>`. O(files). */
export function versionSubjects(content: VersionContent): Subject[] {
  const spec = `${content.name}@${content.version}`;
  return [
    { name: spec, digest: { sha256: hexOf(content.digest) } },
    ...content.files.map((file) => ({ name: `${spec}/${file.path}`, digest: { sha256: hexOf(file.digest) } })),
  ];
}

/**
 * A publisher's statement over a version.
 *
 * @example
 * const statement = signedVersionStatement({ name: "tool", version: "1.0.0", digest, files }, new Date());
 */
export function signedVersionStatement(content: VersionContent, signedAt: Date): Statement {
  return {
    _type: STATEMENT_TYPE,
    subject: versionSubjects(content),
    predicateType: SIGNED_VERSION_PREDICATE,
    predicate: { name: content.name, version: content.version, signedAt: signedAt.toISOString() },
  };
}

/** What the orchestrator knows of the job behind a principal (option `jobOf` of the provenance). */
export interface JobProvenanceSource {
  requestId: string;
  /** The repository URL the orchestrator launched the job for. */
  repository: string;
  commit: string;
  /** `sha256:<hex>` of the job's stored log, as stored when the version was committed. */
  logDigest: string;
  /** How many stored lines `logDigest` covers (the log goes on after the commit). */
  logLines?: number;
  /** Where the log is read (e.g. the console's job page). */
  logUri?: string;
  startedOn?: string;
}

/** What the orchestrator knows of the job that published a version, and who signs for it. */
export interface JobProvenance extends JobProvenanceSource {
  /** The orchestrator's builder ID (a URI). */
  builderId: string;
  finishedOn: string;
}

/**
 * The orchestrator's SLSA Provenance v1 statement over a version a job published.
 *
 * @example
 * const statement = provenanceStatement(content, { builderId, requestId, repository, commit, logDigest, finishedOn });
 */
export function provenanceStatement(content: VersionContent, job: JobProvenance): Statement {
  return {
    _type: STATEMENT_TYPE,
    subject: versionSubjects(content),
    predicateType: SLSA_PROVENANCE_PREDICATE,
    predicate: {
      buildDefinition: {
        buildType: "urn:runner-depot:build-type:job:v1",
        externalParameters: { repository: job.repository, commit: job.commit },
        internalParameters: { requestId: job.requestId },
        resolvedDependencies: [{ uri: `git+${job.repository}`, digest: { gitCommit: job.commit } }],
      },
      runDetails: {
        builder: { id: job.builderId },
        metadata: {
          invocationId: job.requestId,
          ...(job.startedOn ? { startedOn: job.startedOn } : {}),
          finishedOn: job.finishedOn,
        },
        byproducts: [
          {
            name: "log",
            digest: { sha256: hexOf(job.logDigest) },
            ...(job.logUri ? { uri: job.logUri } : {}),
            ...(job.logLines !== undefined ? { annotations: { lines: job.logLines } } : {}),
          },
        ],
      },
    },
  };
}

/** A statement parsed from a DSSE payload, with what the verifier reads out of it. */
export interface ParsedStatement {
  statement: Statement;
  /** When the signer says it signed (signed-version) or the build finished (provenance), ms. */
  signedAt: number;
  /** The builder ID of a provenance statement. */
  builderId?: string;
  /** The job's request ID of a provenance statement. */
  requestId?: string;
}

/** Parses a statement payload (JSON), checking its shape. ATTESTATION_INVALID otherwise. O(payload). */
export function parseStatement(payload: Buffer): ParsedStatement {
  const bad = (why: string) => new RunnerDepotError("ATTESTATION_INVALID", `not an in-toto statement: ${why}`);
  let statement: Statement;
  try {
    statement = JSON.parse(payload.toString("utf8")) as Statement;
  } catch {
    throw bad("not JSON");
  }
  if (typeof statement !== "object" || statement === null || statement._type !== STATEMENT_TYPE)
    throw bad(`_type must be ${STATEMENT_TYPE}`);
  if (!Array.isArray(statement.subject) || statement.subject.length === 0) throw bad("no subject");
  for (const subject of statement.subject) {
    if (typeof subject?.name !== "string" || !/^[0-9a-f]{64}$/.test(String(subject.digest?.sha256)))
      throw bad("each subject needs a name and a sha256");
  }
  const predicate = statement.predicate as Record<string, any> | undefined;
  if (typeof predicate !== "object" || predicate === null) throw bad("no predicate");
  let at: unknown;
  const parsed: Partial<ParsedStatement> = {};
  if (statement.predicateType === SIGNED_VERSION_PREDICATE) at = predicate.signedAt;
  else if (statement.predicateType === SLSA_PROVENANCE_PREDICATE) {
    at = predicate.runDetails?.metadata?.finishedOn;
    const builderId: unknown = predicate.runDetails?.builder?.id;
    const requestId: unknown = predicate.buildDefinition?.internalParameters?.requestId;
    if (typeof builderId !== "string") throw bad("provenance without runDetails.builder.id");
    parsed.builderId = builderId;
    if (typeof requestId === "string") parsed.requestId = requestId;
  } else throw bad(`unknown predicateType ${String(statement.predicateType).slice(0, 100)}`);
  const signedAt = typeof at === "string" ? Date.parse(at) : NaN;
  if (Number.isNaN(signedAt)) throw bad("no signing time");
  return { ...parsed, statement, signedAt };
}

/**
 * Checks that `statement`'s subjects are exactly `content`: the archive subject names this
 * version with its digest, and every file's subject its digest, no more and no fewer.
 * SUBJECT_MISMATCH naming the version or the first file that differs. O(files).
 */
export function checkSubjects(statement: Statement, content: VersionContent): void {
  const spec = `${content.name}@${content.version}`;
  const mismatch = (reason: string, file?: string) =>
    new RunnerDepotError("SUBJECT_MISMATCH", `${spec}: ${reason}`, {
      details: { package: content.name, version: content.version, reason, ...(file !== undefined ? { file } : {}) },
    });
  const [archive, ...rest] = statement.subject;
  if (archive!.name !== spec) throw mismatch(`the signature is about ${archive!.name.slice(0, 200)}, not this version`);
  const signed = new Map<string, string>();
  for (const subject of rest) {
    if (!subject.name.startsWith(`${spec}/`)) throw mismatch(`a subject is about ${subject.name.slice(0, 200)}`);
    signed.set(subject.name.slice(spec.length + 1), subject.digest.sha256);
  }
  for (const file of content.files) {
    const digest = signed.get(file.path);
    if (digest === undefined) throw mismatch(`${file.path} is not signed`, file.path);
    if (digest !== hexOf(file.digest)) throw mismatch(`${file.path} is not the file signed`, file.path);
    signed.delete(file.path);
  }
  const [missing] = signed.keys();
  if (missing !== undefined) throw mismatch(`${missing} was signed but is missing`, missing);
  // Last: a changed file changes the archive too, and the file is the better answer.
  if (archive!.digest.sha256 !== hexOf(content.digest)) throw mismatch("the archive is not the one signed");
}
