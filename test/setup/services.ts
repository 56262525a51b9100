/**
 * What `npm test` uses for PostgreSQL and RabbitMQ, decided once per run by the global
 * setup (test/setup/global-setup.ts) and handed to every test file through vitest's
 * provide/inject (read it through test/fixtures/backends.ts).
 *
 * The rules, in order:
 * - PostgreSQL: `RUNNER_DEPOT_TEST_POSTGRES` (default {@link DEFAULT_POSTGRES_URL}) when it
 *   answers; otherwise an embedded PostgreSQL (PGlite) started for this run. The value
 *   `embedded` skips the probe; `skip` skips its tests.
 * - RabbitMQ: `RUNNER_DEPOT_TEST_RABBITMQ` (default {@link DEFAULT_RABBITMQ_URL}) when it
 *   answers; otherwise a broker started for this run by the first way that can
 *   (`RUNNER_DEPOT_TEST_RABBITMQ_START`, default `docker,rabbitmq-server`; `none` starts
 *   nothing); otherwise its suites are skipped with the reason. The value `skip` skips
 *   them without trying.
 *
 * This file holds only the decision; the probes and starters are passed in, so the
 * decision itself is tested (test/setup/global-setup.test.ts) without touching any service.
 */

export const DEFAULT_POSTGRES_URL = "postgres://postgres@127.0.0.1:5432/test";
export const DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672";
export const DEFAULT_RABBITMQ_START = ["docker", "rabbitmq-server"] as const;

export type ServiceName = "postgres" | "rabbitmq";
export type RabbitMqStarter = (typeof DEFAULT_RABBITMQ_START)[number];

/** What the run uses for one service. Plain JSON: it crosses into the test workers. */
export interface ServiceChoice {
  /** The URL the tests use; null when the service could not be had (its tests skip). */
  url: string | null;
  /** The URL that was asked for (from the environment or the default). */
  requested: string;
  /** How it was had: the requested URL answered, or what was started, or nothing. */
  how: "reachable" | "embedded" | RabbitMqStarter | "unavailable";
  /** One line for people: what was tried and why this came out. */
  reason: string;
  /**
   * RabbitMQ only: the command (argv prefix) that runs `rabbitmqctl` against this very
   * broker, for the tests that stop and start it; null when there is none to be had.
   */
  control?: string[] | null;
}

export interface TestServices {
  postgres: ServiceChoice;
  rabbitmq: ServiceChoice;
}

/** A service started for this run. */
export interface Started {
  url: string;
  control?: string[] | null;
  stop(): Promise<void>;
}

/** The ways to probe and start services; the global setup passes the real ones. */
export interface ServiceWays {
  /** null when the URL answers a real request, else why not (one short line). */
  probePostgres(url: string): Promise<string | null>;
  probeRabbitMq(url: string): Promise<string | null>;
  /** Starts an embedded PostgreSQL; throws with the reason when it cannot. */
  startEmbeddedPostgres(): Promise<Started>;
  /** For each starter: null when it can be tried here, else why not. */
  canStart(starter: RabbitMqStarter): Promise<string | null>;
  /** Starts a broker; throws with the reason when it fails. */
  startRabbitMq(starter: RabbitMqStarter): Promise<Started>;
  /** rabbitmqctl for a broker that was already there at `url`, if this machine can reach its node. */
  localControl(url: string): Promise<string[] | null>;
}

export interface Decision {
  services: TestServices;
  /** Stops whatever was started for this run (nothing for a reachable service). */
  stop(): Promise<void>;
}

/** Decides both services, PostgreSQL and RabbitMQ at the same time. */
export async function decideServices(env: NodeJS.ProcessEnv, ways: ServiceWays): Promise<Decision> {
  const [postgres, rabbitmq] = await Promise.all([decidePostgres(env, ways), decideRabbitMq(env, ways)]);
  return {
    services: { postgres: postgres.choice, rabbitmq: rabbitmq.choice },
    async stop() {
      await Promise.allSettled([postgres.stop(), rabbitmq.stop()]);
    },
  };
}

interface OneDecision {
  choice: ServiceChoice;
  stop(): Promise<void>;
}

const nothingToStop = async () => {};

export async function decidePostgres(env: NodeJS.ProcessEnv, ways: ServiceWays): Promise<OneDecision> {
  const requested = env.RUNNER_DEPOT_TEST_POSTGRES?.trim() || DEFAULT_POSTGRES_URL;
  if (requested === "skip") {
    return {
      choice: { url: null, requested, how: "unavailable", reason: "RUNNER_DEPOT_TEST_POSTGRES=skip" },
      stop: nothingToStop,
    };
  }
  let why: string;
  if (requested === "embedded") {
    why = "RUNNER_DEPOT_TEST_POSTGRES=embedded";
  } else {
    const failure = await ways.probePostgres(requested);
    if (failure === null) {
      return {
        choice: { url: requested, requested, how: "reachable", reason: `answered at ${redact(requested)}` },
        stop: nothingToStop,
      };
    }
    why = `nothing usable at ${redact(requested)} (${failure})`;
  }
  try {
    const started = await ways.startEmbeddedPostgres();
    return {
      choice: {
        url: started.url,
        requested,
        how: "embedded",
        reason: `${why}; started an embedded PostgreSQL (PGlite) at ${redact(started.url)}`,
      },
      stop: () => started.stop(),
    };
  } catch (error) {
    return {
      choice: {
        url: null,
        requested,
        how: "unavailable",
        reason: `${why}; the embedded PostgreSQL did not start (${message(error)})`,
      },
      stop: nothingToStop,
    };
  }
}

export async function decideRabbitMq(env: NodeJS.ProcessEnv, ways: ServiceWays): Promise<OneDecision> {
  const requested = env.RUNNER_DEPOT_TEST_RABBITMQ?.trim() || DEFAULT_RABBITMQ_URL;
  if (requested === "skip") {
    return {
      choice: { url: null, requested, how: "unavailable", reason: "RUNNER_DEPOT_TEST_RABBITMQ=skip", control: null },
      stop: nothingToStop,
    };
  }
  const failure = await ways.probeRabbitMq(requested);
  if (failure === null) {
    const control = await ways.localControl(requested);
    return {
      choice: { url: requested, requested, how: "reachable", reason: `answered at ${redact(requested)}`, control },
      stop: nothingToStop,
    };
  }
  const tried = [`nothing at ${redact(requested)} (${failure})`];
  for (const starter of startersFrom(env)) {
    const cannot = await ways.canStart(starter);
    if (cannot !== null) {
      tried.push(`${starter}: ${cannot}`);
      continue;
    }
    try {
      const started = await ways.startRabbitMq(starter);
      tried.push(`started one with ${starter} at ${redact(started.url)}`);
      return {
        choice: {
          url: started.url,
          requested,
          how: starter,
          reason: tried.join("; "),
          control: started.control ?? null,
        },
        stop: () => started.stop(),
      };
    } catch (error) {
      tried.push(`${starter} failed: ${message(error)}`);
    }
  }
  if (startersFrom(env).length === 0) tried.push("RUNNER_DEPOT_TEST_RABBITMQ_START=none");
  return {
    choice: { url: null, requested, how: "unavailable", reason: tried.join("; "), control: null },
    stop: nothingToStop,
  };
}

/** The starters to try, in order, from RUNNER_DEPOT_TEST_RABBITMQ_START. Unknown names are an error. */
export function startersFrom(env: NodeJS.ProcessEnv): RabbitMqStarter[] {
  const raw = env.RUNNER_DEPOT_TEST_RABBITMQ_START?.trim();
  if (!raw) return [...DEFAULT_RABBITMQ_START];
  if (raw === "none") return [];
  const names = raw
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
  for (const name of names) {
    if (!(DEFAULT_RABBITMQ_START as readonly string[]).includes(name)) {
      throw new Error(
        `RUNNER_DEPOT_TEST_RABBITMQ_START: unknown way "${name}" (use ${DEFAULT_RABBITMQ_START.join(", ")} or none)`,
      );
    }
  }
  return names as RabbitMqStarter[];
}

/**
 * The services as a process outside vitest sees them (bench, soak): the environment or
 * the defaults, nothing probed or started.
 */
export function servicesFromEnv(env: NodeJS.ProcessEnv): TestServices {
  const postgres = env.RUNNER_DEPOT_TEST_POSTGRES?.trim() || DEFAULT_POSTGRES_URL;
  const rabbitmq = env.RUNNER_DEPOT_TEST_RABBITMQ?.trim() || DEFAULT_RABBITMQ_URL;
  return {
    postgres: { url: postgres, requested: postgres, how: "reachable", reason: "from the environment (not probed)" },
    rabbitmq: {
      url: rabbitmq,
      requested: rabbitmq,
      how: "reachable",
      reason: "from the environment (not probed)",
      control: ["rabbitmqctl"],
    },
  };
}

/** The URL with any password replaced, for printing. */
export function redact(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = "***";
    return parsed.toString().replace(/\/$/, "");
  } catch {
    return url;
  }
}

function message(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).split("\n")[0]!;
}
