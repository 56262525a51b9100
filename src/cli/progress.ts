/**
 * Progress for `publish` and `install`, counted in bytes: on a terminal one line redrawn
 * in place (bar, percentage, bytes done of total, rate, ETA) that fits the terminal's
 * width and never more than 80 columns; plain lines at most once a second otherwise
 * (CI logs, pipes).
 */

/** A progress sink for one transfer. */
export interface Progress {
  /** Bytes done so far of `total` (undefined when the size is not known). */
  update(done: number, total: number | undefined): void;
  /** Draws the final state, ends the line, then prints `message` if given. */
  stop(message?: string): void;
}

/** Human-readable byte count. */
export function formatBytes(bytes: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

/** Seconds as m:ss (h:mm:ss past an hour, `>99h` past 99 hours); `--:--` when unknown. */
function formatEta(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return "--:--";
  const s = Math.round(seconds);
  if (s >= 100 * 3600) return ">99h";
  const two = (n: number) => String(n).padStart(2, "0");
  if (s >= 3600) return `${Math.floor(s / 3600)}:${two(Math.floor((s % 3600) / 60))}:${two(s % 60)}`;
  return `${Math.floor(s / 60)}:${two(s % 60)}`;
}

/**
 * Widest line the bar draws: the terminal's width, at most 80, minus one (no auto-wrap in the last column); 30 at
 * least.
 */
export function lineWidth(columns: number | undefined): number {
  return Math.max(30, Math.min(columns && columns > 0 ? columns : 80, 80) - 1);
}

/**
 * One progress line: `<title> [####-----]  42% 1.2 MiB/2.9 MiB 3.4 MiB/s ETA 0:01`,
 * exactly `width` characters or fewer (the title is shortened first, then the bar).
 */
export function renderProgressLine(
  title: string,
  done: number,
  total: number | undefined,
  elapsedMs: number,
  width: number,
): string {
  const rate = done / Math.max(elapsedMs / 1000, 0.001);
  const known = total !== undefined && total > 0;
  const fraction = known ? Math.min(1, done / total) : 0;
  const pct = known ? `${String(Math.floor(fraction * 100)).padStart(3)}%` : " --%";
  const amounts = known ? `${formatBytes(done)}/${formatBytes(total)}` : formatBytes(done);
  const eta = known ? formatEta(done >= total ? 0 : rate > 0 ? (total - done) / rate : Number.NaN) : "--:--";
  const speed = ` ${formatBytes(rate)}/s ETA ${eta}`;
  // On a narrow line the amounts go first, then the percentage; rate and ETA always stay.
  const tail = [` ${pct} ${amounts}${speed}`, ` ${pct}${speed}`, speed].find((t) => t.length <= width) ?? speed;
  const room = width - tail.length;
  // The bar takes 10 to 24 cells (plus " []"); the title is shortened before the bar goes.
  let barCells = Math.min(24, room - title.length - 3);
  if (barCells < 10) barCells = room >= 10 + 3 + 8 ? 10 : 0;
  const titleRoom = Math.max(0, room - (barCells > 0 ? barCells + 3 : 0));
  const shownTitle = title.length <= titleRoom ? title : titleRoom >= 2 ? `${title.slice(0, titleRoom - 1)}…` : "";
  const filled = Math.round(fraction * barCells);
  const bar = barCells > 0 ? ` [${"#".repeat(filled)}${"-".repeat(barCells - filled)}]` : "";
  return `${shownTitle}${bar}${tail}`;
}

/**
 * Creates the progress sink for `stream`: a redrawn line on a terminal (at most every
 * `redrawMs`), plain lines at most every `intervalMs` otherwise.
 *
 * @example
 * const progress = createProgress("install app@2.0.0");
 * progress.update(512 * 1024, 2 * 1024 * 1024);
 * progress.stop("installed app@2.0.0");
 */
export function createProgress(
  title: string,
  stream: NodeJS.WriteStream = process.stderr,
  options: { intervalMs?: number; redrawMs?: number } = {},
): Progress {
  const started = Date.now();
  let lastDraw = 0;
  let drawn = false;
  let latest: { done: number; total: number | undefined } | undefined;
  if (stream.isTTY) {
    const redrawMs = options.redrawMs ?? 100;
    const draw = () => {
      if (!latest) return;
      const line = renderProgressLine(
        title,
        latest.done,
        latest.total,
        Date.now() - started,
        lineWidth(stream.columns),
      );
      // Carriage return, the line, then erase to the end of the line (a shorter redraw leaves no tail).
      stream.write(`\r${line}\x1b[K`);
      drawn = true;
      lastDraw = Date.now();
    };
    return {
      update(done, total) {
        latest = { done, total };
        if (!drawn || Date.now() - lastDraw >= redrawMs) draw();
      },
      stop(message) {
        draw();
        if (drawn) stream.write("\n");
        if (message) stream.write(`${message}\n`);
      },
    };
  }
  const intervalMs = options.intervalMs ?? 1000;
  let printed: number | undefined;
  const print = () => {
    if (!latest) return;
    const { done, total } = latest;
    printed = done;
    const rate = formatBytes(done / Math.max((Date.now() - started) / 1000, 0.001));
    stream.write(
      `${title}: ${formatBytes(done)}${total !== undefined ? ` of ${formatBytes(total)}` : ""}, ${rate}/s\n`,
    );
    lastDraw = Date.now();
  };
  return {
    update(done, total) {
      latest = { done, total };
      if (Date.now() - lastDraw >= intervalMs) print();
    },
    stop(message) {
      // The last amount is always printed: a log that stopped at "0 B of 6 B" read as a stall.
      if (latest && printed !== latest.done) print();
      if (message) stream.write(`${message}\n`);
    },
  };
}
