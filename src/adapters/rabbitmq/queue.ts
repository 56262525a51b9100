/**
 * The job-result queue on RabbitMQ: persistent messages on a durable queue, published on
 * a confirm channel, so `publishJobResult` resolves only once the broker has taken
 * responsibility for the message. The adapter survives broker restarts: it reconnects
 * in the background with back-off, and a publish made during an outage is retried until
 * `publishTimeoutMs`, then rejected with UNAVAILABLE (the service turns that into a
 * retryable call error for the runner).
 */
import amqp from "amqplib";
import type { ChannelModel, ConfirmChannel, Options } from "amqplib";
import { RunnerDepotError } from "../../errors.js";
import type { JobResult, JobResultQueue } from "../../runner/ports.js";
import { silentLogger, type Logger } from "../../telemetry.js";

/** The AMQP `type` property every job result carries. */
export const JOB_RESULT_MESSAGE_TYPE = "runner.v1.JobResult";

/** Options of {@link createRabbitMqQueue}. */
export interface RabbitMqQueueOptions {
  /** AMQP URL, e.g. `amqp://guest:guest@127.0.0.1:5672`; its `?heartbeat=N` wins over `heartbeatSeconds`. */
  url: string;
  /**
   * AMQP heartbeat asked of the broker, in seconds; default 5. A connection that hears
   * nothing for two of them (a stalled broker, a link that drops bytes) is closed and
   * replaced. 0 turns heartbeats off (a dead connection is then never noticed).
   */
  heartbeatSeconds?: number;
  /** Exchange to publish to; default `""` (the default exchange, routed by queue name). */
  exchange?: string;
  /** Type of `exchange` when the adapter declares it; default `direct`. */
  exchangeType?: string;
  /** Routing key; default the queue name. */
  routingKey?: string;
  /**
   * Durable queue declared (and bound to `exchange`) on every connect; default
   * `runner.job-results`. `null` declares nothing: the host owns the topology.
   */
  queue?: string | null;
  /** Extra `x-…` arguments for the declared queue (e.g. `x-queue-type: quorum`). */
  queueArguments?: Record<string, unknown>;
  /**
   * How long one publish keeps retrying through an outage before UNAVAILABLE; default 8 000. Keep it below the
   * runner service's publish bound (`publishRetry.maxMs`, default 10 000): then a publish settles inside the
   * call that made it and the service can still retry or answer UNAVAILABLE with a definite outcome.
   * Why: docs/decisions/backends.md, "queue.ts: RabbitMqQueueOptions.publishTimeoutMs".
   */
  publishTimeoutMs?: number;
  /** Reconnect back-off: first delay and cap, in ms; default 100 and 5 000. */
  reconnectDelayMs?: { initial?: number; max?: number };
  /** TCP connect timeout in ms; default 5 000. */
  connectTimeoutMs?: number;
  /** Called with every broker or connection error (they never crash the process). */
  onError?: (error: unknown) => void;
  /**
   * Pino-compatible logger for connection events: `queue connection lost`, `queue connect
   * failed` (with the attempt and the error's message) and `queue reconnected`, all at warn.
   * The URL (it carries credentials) is never logged. Default silent.
   */
  logger?: Logger;
}

/** The RabbitMQ queue: a {@link JobResultQueue} plus a readiness probe. */
export interface RabbitMqQueue extends JobResultQueue {
  /** Resolves once connected (connecting if needed); rejects UNAVAILABLE after `timeoutMs`. */
  ready(timeoutMs?: number): Promise<void>;
  /** True while a confirm channel is open. */
  readonly connected: boolean;
  close(): Promise<void>;
}

/**
 * Creates a {@link JobResultQueue} that publishes each job result to RabbitMQ.
 *
 * @example
 * const queue = createRabbitMqQueue({ url: "amqp://guest:guest@127.0.0.1:5672" });
 * const runner = createRunnerService(queue, { logs });
 * // … on shutdown
 * await queue.close();
 */
export function createRabbitMqQueue(options: RabbitMqQueueOptions): RabbitMqQueue {
  const exchange = options.exchange ?? "";
  const queueName = options.queue === undefined ? "runner.job-results" : options.queue;
  const routingKey = options.routingKey ?? queueName ?? "";
  // Below the runner service's default publish bound (10 s): see the option's doc.
  const publishTimeoutMs = options.publishTimeoutMs ?? 8_000;
  const initialDelay = options.reconnectDelayMs?.initial ?? 100;
  const maxDelay = options.reconnectDelayMs?.max ?? 5_000;
  const connectTimeoutMs = options.connectTimeoutMs ?? 5_000;
  const onError = options.onError ?? (() => {});
  const url = withHeartbeat(options.url, options.heartbeatSeconds ?? 5);
  const logger = options.logger ?? silentLogger;
  // Set once a connection was lost: the next successful connect is a reconnect.
  let lost = false;
  if (exchange === "" && !routingKey) {
    throw new RunnerDepotError("INVALID_ARGUMENT", "createRabbitMqQueue needs a queue or a routingKey");
  }

  let model: ChannelModel | null = null;
  let channel: ConfirmChannel | null = null;
  let connecting: Promise<ConfirmChannel> | null = null;
  let reconnectTimer: NodeJS.Timeout | null = null;
  let failures = 0;
  let closed = false;
  // Wakes publishers waiting for a channel as soon as a reconnect succeeds.
  let waiters: Array<() => void> = [];
  // messageId → messages the broker returned as unroutable, not yet matched to a confirm.
  const returned = new Map<string, number>();
  // messageId → the publish of that result awaiting its confirm: a retry of the same result
  // while its channel lives waits for that confirm instead of sending a second copy.
  const unconfirmed = new Map<string, Unconfirmed>();
  // messageId → a result confirmed after its caller was told UNAVAILABLE: the caller's retry
  // of that result is answered by this confirm, never published again. Oldest dropped first.
  const lateConfirmed = new Map<string, string>();

  function backoff(attempt: number): number {
    const base = Math.min(maxDelay, initialDelay * 2 ** Math.min(attempt, 16));
    return base / 2 + Math.random() * (base / 2);
  }

  function wake(): void {
    const list = waiters;
    waiters = [];
    for (const w of list) w();
  }

  async function connect(): Promise<ConfirmChannel> {
    const m = await amqp.connect(url, { timeout: connectTimeoutMs });
    // Listeners first: an 'error' without a listener would crash the host process.
    m.on("error", (error: unknown) => onError(error));
    m.on("close", () => {
      if (model === m) {
        model = null;
        channel = null;
        if (!closed) {
          lost = true;
          logger.warn({ queue: queueName ?? exchange }, "queue connection lost");
        }
        scheduleReconnect();
      }
    });
    if (closed) {
      await m.close().catch(() => {});
      throw unavailable("queue closed");
    }
    try {
      const ch = await m.createConfirmChannel();
      ch.on("error", (error: unknown) => onError(error));
      // With `mandatory`, an unroutable message comes back (basic.return) before its
      // confirm; without this a result published into a void would count as accepted.
      ch.on("return", (msg: { properties: { messageId?: string } }) => {
        const id = msg.properties.messageId ?? "";
        returned.set(id, (returned.get(id) ?? 0) + 1);
      });
      ch.on("close", () => {
        // Returns pair with confirms of the same channel only; none will come for this one.
        returned.clear();
        if (channel === ch) {
          channel = null;
          // A channel closed by the broker (e.g. a 404 on the exchange) while the
          // connection lives: drop the connection too so one reconnect path handles both.
          if (model === m) m.close().catch(() => {});
        }
      });
      if (exchange !== "") await ch.assertExchange(exchange, options.exchangeType ?? "direct", { durable: true });
      if (queueName) {
        await ch.assertQueue(queueName, { durable: true, arguments: options.queueArguments });
        if (exchange !== "") await ch.bindQueue(queueName, exchange, routingKey);
      }
      model = m;
      channel = ch;
      if (lost) logger.warn({ queue: queueName ?? exchange, attempts: failures + 1 }, "queue reconnected");
      lost = false;
      failures = 0;
      wake();
      return ch;
    } catch (error) {
      await m.close().catch(() => {});
      throw error;
    }
  }

  function getChannel(): Promise<ConfirmChannel> {
    if (closed) return Promise.reject(unavailable("queue closed"));
    if (channel) return Promise.resolve(channel);
    if (!connecting) {
      connecting = connect().finally(() => {
        connecting = null;
      });
      connecting.catch((error) => {
        failures++;
        lost = true;
        logger.warn(
          {
            queue: queueName ?? exchange,
            attempt: failures,
            error: error instanceof Error ? error.message : String(error),
          },
          "queue connect failed",
        );
        onError(error);
        scheduleReconnect();
      });
    }
    return connecting;
  }

  function scheduleReconnect(): void {
    if (closed || reconnectTimer || channel || connecting) return;
    reconnectTimer = setTimeout(() => {
      reconnectTimer = null;
      getChannel().catch(() => {});
    }, backoff(failures));
    reconnectTimer.unref();
  }

  function publishOnce(ch: ConfirmChannel, body: Buffer, props: Options.Publish): Promise<void> {
    return new Promise((resolve, reject) => {
      try {
        // The return value only says the socket buffer is full; the confirm still comes.
        ch.publish(exchange, routingKey, body, props, (error) => {
          if (error) return reject(error);
          const id = props.messageId ?? "";
          const count = returned.get(id) ?? 0;
          if (count === 0) return resolve();
          if (count === 1) returned.delete(id);
          else returned.set(id, count - 1);
          reject(new Error(`no queue is bound to exchange "${exchange}" with routing key "${routingKey}"`));
        });
      } catch (error) {
        reject(error);
      }
    });
  }

  /**
   * Publishes on `ch` unless the same result already waits for its confirm there (a publish
   * that timed out on a stalled broker): then its confirm is the answer. A result made again
   * for a replayed end differs in its times only, so `same` leaves them out. O(1).
   */
  function sendOnce(ch: ConfirmChannel, body: Buffer, same: string, props: Options.Publish): Promise<void> {
    const id = props.messageId ?? "";
    const pending = unconfirmed.get(id);
    if (pending && pending.channel === ch && pending.same === same) return pending.confirmed;
    const entry: Unconfirmed = { channel: ch, same, confirmed: publishOnce(ch, body, props), abandoned: false };
    unconfirmed.set(id, entry);
    const forget = () => {
      if (unconfirmed.get(id) === entry) unconfirmed.delete(id);
    };
    entry.confirmed.then(() => {
      forget();
      if (!entry.abandoned) return;
      lateConfirmed.delete(id);
      if (lateConfirmed.size >= MAX_LATE_CONFIRMED) lateConfirmed.delete(lateConfirmed.keys().next().value!);
      lateConfirmed.set(id, same);
    }, forget);
    return entry.confirmed;
  }

  /** Waits until a channel is open, the deadline passes, or `ms` elapse. */
  function pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done(): void {
        clearTimeout(timer);
        waiters = waiters.filter((w) => w !== done);
        resolve();
      }
      waiters.push(done);
    });
  }

  function withDeadline<T>(promise: Promise<T>, deadline: number): Promise<T> {
    const left = deadline - Date.now();
    if (left <= 0) {
      // The abandoned promise may still reject (e.g. "channel closed" for its confirm):
      // never leave that rejection unhandled, it would crash the host process.
      promise.catch(() => {});
      return Promise.reject(unavailable("publish timed out"));
    }
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => reject(unavailable("publish timed out")), left);
      promise.then(
        (value) => {
          clearTimeout(timer);
          resolve(value);
        },
        (error) => {
          clearTimeout(timer);
          reject(error);
        },
      );
    });
  }

  return {
    get connected() {
      return channel !== null;
    },

    async ready(timeoutMs = publishTimeoutMs) {
      const deadline = Date.now() + timeoutMs;
      let lastError: unknown;
      for (let attempt = 0; ; attempt++) {
        if (closed) throw unavailable("queue closed");
        try {
          await withDeadline(getChannel(), deadline);
          return;
        } catch (error) {
          lastError = error;
        }
        const left = deadline - Date.now();
        if (left <= 0) throw unavailable("RabbitMQ unreachable", lastError);
        await pause(Math.min(left, backoff(attempt)));
      }
    },

    async publishJobResult(result: JobResult) {
      const body = Buffer.from(JSON.stringify(result), "utf8");
      const same = JSON.stringify({ ...result, startedAt: undefined, endedAt: undefined });
      const props: Options.Publish = {
        persistent: true,
        mandatory: true,
        messageId: result.requestId,
        contentType: "application/json",
        contentEncoding: "utf-8",
        type: JOB_RESULT_MESSAGE_TYPE,
        timestamp: Math.floor(Date.now() / 1000),
        appId: "runner-depot",
      };
      const id = result.requestId;
      if (lateConfirmed.get(id) === same) {
        lateConfirmed.delete(id);
        return; // the broker confirmed it after the earlier call had given up
      }
      const deadline = Date.now() + publishTimeoutMs;
      let lastError: unknown;
      for (let attempt = 0; ; attempt++) {
        if (closed) throw unavailable("queue closed", lastError);
        try {
          const ch = await withDeadline(getChannel(), deadline);
          // A confirm lost with its connection is retried on the next one: delivery is at
          // least once, at most one copy per connection; consumers deduplicate on messageId.
          await withDeadline(sendOnce(ch, body, same, props), deadline);
          return;
        } catch (error) {
          lastError = error;
        }
        const left = deadline - Date.now();
        if (left <= 0) {
          // Still awaiting its confirm: a late one answers this result's retry (lateConfirmed).
          const pending = unconfirmed.get(id);
          if (pending && pending.same === same) pending.abandoned = true;
          throw unavailable(
            `RabbitMQ did not accept the result of job ${result.requestId} within ${publishTimeoutMs} ms`,
            lastError,
          );
        }
        await pause(Math.min(left, backoff(attempt)));
      }
    },

    async close() {
      if (closed) return;
      closed = true;
      if (reconnectTimer) clearTimeout(reconnectTimer);
      reconnectTimer = null;
      wake();
      await connecting?.catch(() => {});
      const m = model;
      model = null;
      channel = null;
      if (m) await m.close().catch(() => {});
    },
  };
}

/** A result sent on a channel and not yet confirmed. */
interface Unconfirmed {
  channel: ConfirmChannel;
  /** The result without its times (a replayed end's result differs in them only). */
  same: string;
  confirmed: Promise<void>;
  /** Its caller was answered UNAVAILABLE while it waited. */
  abandoned: boolean;
}

/** Results confirmed late remembered at most (a few hundred bytes each). */
const MAX_LATE_CONFIRMED = 10_000;

/** The URL with `heartbeat=seconds` unless it names its own. */
function withHeartbeat(url: string, seconds: number): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return url; // amqplib reports a bad URL on connect, without echoing credentials here
  }
  if (parsed.searchParams.has("heartbeat")) return url;
  parsed.searchParams.set("heartbeat", String(seconds));
  return parsed.toString();
}

function unavailable(message: string, cause?: unknown): RunnerDepotError {
  const detail = cause instanceof Error ? `: ${cause.message}` : "";
  return new RunnerDepotError("UNAVAILABLE", message + detail, { cause });
}
