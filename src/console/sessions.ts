/**
 * Console sessions for hosts without their own login (the `serve` command): one-time
 * login tokens printed at startup (`…/-/console/?token=…`, as Jupyter does) that turn
 * into an HttpOnly, SameSite=Strict session cookie, plus each session's CSRF token.
 *
 * Bounds: at most `maxLoginTokens` unredeemed tokens and `maxSessions` sessions (the
 * oldest goes first), every lookup O(1) in a Map, compared by hash so a guess costs the
 * same whether or not a prefix matches.
 */
import { createHash, randomBytes } from "node:crypto";

/** Options of {@link createConsoleSessions}. */
export interface ConsoleSessionsOptions {
  /** How long a login token may wait to be used; default 24 h. */
  loginTtlMs?: number;
  /** How long a session lasts after its last request; default 12 h. */
  idleMs?: number;
  /** Unredeemed login tokens kept (older ones stop working); default 16. */
  maxLoginTokens?: number;
  /** Sessions kept (the least recently used is dropped); default 1000. */
  maxSessions?: number;
}

/** What a request's session cookie resolved to. */
export interface ConsoleSession {
  id: string;
  /** Sent back in `x-csrf-token` on state-changing requests. */
  csrf: string;
}

/** One-time login tokens and the sessions they open. */
export interface ConsoleSessions {
  /** Mints a login token: valid once, for `loginTtlMs`. */
  loginToken(): string;
  /** Redeems a login token (once) into a new session, or null. */
  redeem(token: string): ConsoleSession | null;
  /** The session of a cookie value, or null (and refreshes its idle timer). */
  session(id: string): ConsoleSession | null;
  /** Ends a session. */
  end(id: string): void;
  /** The cookie's name. */
  readonly cookieName: string;
  /** Session lifetime in seconds, for the cookie's Max-Age. */
  readonly maxAgeSeconds: number;
}

const digest = (value: string) => createHash("sha256").update(value).digest("base64url");
const TOKEN = /^[A-Za-z0-9_-]{43}$/;

/**
 * Creates the console's login-token sessions.
 *
 * @example
 * const sessions = createConsoleSessions();
 * const console = createConsole({ runner, depot, sessions, base: "/-/console" });
 * process.stderr.write(`console: ${origin}/-/console/?token=${sessions.loginToken()}\n`);
 */
export function createConsoleSessions(options: ConsoleSessionsOptions = {}): ConsoleSessions {
  const loginTtlMs = options.loginTtlMs ?? 24 * 3600_000;
  const idleMs = options.idleMs ?? 12 * 3600_000;
  const maxLogin = options.maxLoginTokens ?? 16;
  const maxSessions = options.maxSessions ?? 1000;
  // Keyed by the token's hash: the map never holds a usable secret.
  const logins = new Map<string, number>();
  const sessions = new Map<string, { csrf: string; seen: number }>();

  return {
    cookieName: "runner_depot_console",
    maxAgeSeconds: Math.floor(idleMs / 1000),
    loginToken() {
      const token = randomBytes(32).toString("base64url");
      logins.set(digest(token), Date.now() + loginTtlMs);
      while (logins.size > maxLogin) logins.delete(logins.keys().next().value!);
      return token;
    },
    redeem(token) {
      if (!TOKEN.test(token)) return null;
      const key = digest(token);
      const until = logins.get(key);
      // Deleted before anything else: a token works once, even if two requests race.
      logins.delete(key);
      if (until === undefined || until < Date.now()) return null;
      const id = randomBytes(32).toString("base64url");
      const csrf = randomBytes(32).toString("base64url");
      sessions.set(digest(id), { csrf, seen: Date.now() });
      while (sessions.size > maxSessions) sessions.delete(sessions.keys().next().value!);
      return { id, csrf };
    },
    session(id) {
      if (!TOKEN.test(id)) return null;
      const key = digest(id);
      const found = sessions.get(key);
      if (!found) return null;
      if (found.seen + idleMs < Date.now()) {
        sessions.delete(key);
        return null;
      }
      found.seen = Date.now();
      // Re-inserted: the Map's order is least recently used first, for eviction.
      sessions.delete(key);
      sessions.set(key, found);
      return { id, csrf: found.csrf };
    },
    end(id) {
      if (TOKEN.test(id)) sessions.delete(digest(id));
    },
  };
}
