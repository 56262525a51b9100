/**
 * Authorization for the depot router: a host hook, plus a bearer-token helper with
 * tokens scoped to package-name patterns.
 */
import { createHash } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";

/** What a request wants to do: read (installer API) or publish (packager API). */
export type DepotAction = "read" | "publish";

/** What {@link Authorize} is asked about; `name` is absent for the catalog. */
export interface AuthorizeContext {
  action: DepotAction;
  /** The lower-case package name, when the request concerns one package. */
  name?: string;
}

/**
 * The router's auth hook. Throw a RunnerDepotError (UNAUTHENTICATED → 401,
 * PERMISSION_DENIED → 403) or return `false` (403) to refuse; return a string (the
 * principal transactions are bound to), `true` or nothing to allow.
 */
export type Authorize = (request: Request, context: AuthorizeContext) => unknown;

/** Scopes of one token: package-name patterns (`*` any run, `?` one character). */
export type TokenScopes = readonly string[] | { read?: readonly string[]; publish?: readonly string[] };

/** Options of {@link bearerTokens}. */
export interface BearerTokensOptions {
  /**
   * Let anyone read (catalog, version, depend, data): requests without a token, and
   * tokens whatever their scopes (a scope then limits publishing only). Default false.
   */
  publicRead?: boolean;
  /** The realm in `WWW-Authenticate`. Default "runner-depot". */
  realm?: string;
}

interface Grant {
  principal: string;
  read: RegExp[];
  publish: RegExp[];
}

function hashToken(token: string): string {
  return createHash("sha256").update(token).digest("hex");
}

/**
 * Compiles a package-name glob (case-insensitive) to a RegExp that never backtracks into
 * an earlier `*`: each middle segment is taken at its first occurrence, through an atomic
 * lookahead (`(?=(.*?seg))\1`), which is how a glob matches. O(name × glob) per test; the
 * plain `.*` form took O(name^stars) on a name that fails (`*-*-*-*-*-*y` against 63
 * dashes: seconds), and the name is the requester's.
 */
export function namePattern(glob: string): RegExp {
  const segment = (text: string) =>
    [...text].map((ch) => (ch === "?" ? "[^]" : ch.replace(/[.+^${}()|[\]\\-]/g, "\\$&"))).join("");
  const parts = glob.toLowerCase().split("*");
  if (parts.length === 1) return new RegExp(`^${segment(parts[0]!)}$`);
  let body = segment(parts[0]!);
  let group = 0;
  for (const middle of parts.slice(1, -1)) {
    if (middle === "") continue;
    group++;
    body += `(?=([^]*?${segment(middle)}))\\${group}`;
  }
  return new RegExp(`^${body}[^]*${segment(parts.at(-1)!)}$`);
}

/**
 * The principal {@link bearerTokens} names a token by (what the router's `quota` option is asked about). O(token).
 *
 * @example
 * const quota = (principal: string) => (principal === tokenPrincipal(ciToken) ? { bytes: 10 * 2 ** 30 } : undefined);
 */
export function tokenPrincipal(token: string): string {
  return `token:${hashToken(token).slice(0, 16)}`;
}

/**
 * Builds an {@link Authorize} hook from a map of bearer tokens to name scopes. A plain
 * list of patterns grants read and publish; `{ read, publish }` grants each separately.
 * The principal is a hash of the token, so transactions stay bound to their token.
 *
 * @example
 * const depot = createPackageRouter(store, {
 *   authorize: bearerTokens({ [process.env.CI_TOKEN!]: ["ci-*"], [readToken]: { read: ["*"] } }),
 * });
 */
export function bearerTokens(tokens: Record<string, TokenScopes>, options: BearerTokensOptions = {}): Authorize {
  const realm = options.realm ?? "runner-depot";
  // Looked up by hash so the comparison never runs over the secret itself.
  const grants = new Map<string, Grant>();
  for (const [token, scopes] of Object.entries(tokens)) {
    if (token.length === 0) throw new RunnerDepotError("BAD_REQUEST", "bearerTokens: an empty token");
    const both = Array.isArray(scopes) ? (scopes as readonly string[]) : undefined;
    const split = both ? undefined : (scopes as { read?: readonly string[]; publish?: readonly string[] });
    const digest = hashToken(token);
    grants.set(digest, {
      principal: tokenPrincipal(token),
      read: (both ?? split?.read ?? []).map(namePattern),
      publish: (both ?? split?.publish ?? []).map(namePattern),
    });
  }
  return (request, { action, name }) => {
    const header = request.headers.get("authorization");
    if (header === null) {
      if (options.publicRead && action === "read") return "anonymous";
      throw new RunnerDepotError("UNAUTHENTICATED", "This depot needs a bearer token", {
        details: { wwwAuthenticate: `Bearer realm="${realm}"` },
      });
    }
    const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
    const grant = match ? grants.get(hashToken(match[1]!)) : undefined;
    if (!grant) {
      throw new RunnerDepotError("UNAUTHENTICATED", "The bearer token is not valid", {
        details: { wwwAuthenticate: `Bearer realm="${realm}", error="invalid_token"` },
      });
    }
    const patterns = action === "read" ? [...grant.read, ...grant.publish] : grant.publish;
    // On a public-read depot a token never reads less than no token: a CI token scoped
    // to its own packages still installs public dependencies.
    const publicRead = options.publicRead === true && action === "read";
    const allowed = publicRead || (name === undefined ? patterns.length > 0 : patterns.some((p) => p.test(name)));
    if (!allowed) {
      throw new RunnerDepotError(
        "PERMISSION_DENIED",
        `This token may not ${action} ${name === undefined ? "here" : JSON.stringify(name)}`,
      );
    }
    return grant.principal;
  };
}
