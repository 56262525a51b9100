/**
 * The log viewer's line renderer: a terminal's view of one stored line. SGR escapes (ESC [ … m) become styled
 * runs; a carriage return moves back to the line's start and later text overwrites earlier text, as a
 * terminal shows a progress line; backspace moves back one cell; ESC [ K erases to the end; other escape
 * sequences (cursor moves, OSC titles and links) and control characters are dropped, never shown raw.
 * Why: docs/decisions/console.md, "ansi.ts: rendering lines as a terminal shows them".
 */

/** A run of text in one style: CSS classes and, for 256-colour and true-colour, CSS colours. */
export interface AnsiRun {
  text: string;
  /**
   * Space-separated classes: a-b bold, a-d dim, a-i italic, a-u underline, a-s strike, a-f<n> / a-g<n> colours 0–15.
   */
  cls: string;
  fg?: string;
  bg?: string;
}

/**
 * Renders one line as a terminal would show it.
 *
 * @example
 * parseAnsiLine("\u001b[31mred\u001b[0m\rg");
 * // → [{ text: "g", cls: "" }, { text: "ed", cls: "a-f1" }]
 */
export function parseAnsiLine(input: string): AnsiRun[] {
  interface Style {
    b: boolean;
    d: boolean;
    i: boolean;
    u: boolean;
    s: boolean;
    inv: boolean;
    fg: number | string | null;
    bg: number | string | null;
  }
  const fresh = (): Style => ({ b: false, d: false, i: false, u: false, s: false, inv: false, fg: null, bg: null });
  let style = fresh();
  // One cell per character: its text (a code point) and the style it was written in.
  const chars: string[] = [];
  const styles: Style[] = [];
  let col = 0;

  function color256(n: number): string {
    if (n < 16) return String(n);
    if (n < 232) {
      const v = n - 16;
      const level = (x: number) => (x === 0 ? 0 : 55 + x * 40);
      return `rgb(${level(Math.floor(v / 36))},${level(Math.floor(v / 6) % 6)},${level(v % 6)})`;
    }
    const g = 8 + (n - 232) * 10;
    return `rgb(${g},${g},${g})`;
  }
  function extended(params: number[], at: number): { value: number | string | null; used: number } {
    if (params[at + 1] === 5 && params[at + 2] !== undefined) {
      const n = params[at + 2]!;
      if (n < 0 || n > 255) return { value: null, used: 2 };
      const c = color256(n);
      return { value: n < 16 ? n : c, used: 2 };
    }
    if (params[at + 1] === 2 && params[at + 4] !== undefined) {
      const [r, g, b] = [params[at + 2]!, params[at + 3]!, params[at + 4]!].map((x) => Math.max(0, Math.min(255, x)));
      return { value: `rgb(${r},${g},${b})`, used: 4 };
    }
    return { value: null, used: params.length };
  }
  function sgr(params: number[]): void {
    if (params.length === 0) params = [0];
    for (let k = 0; k < params.length; k++) {
      const p = params[k]!;
      if (p === 0) style = fresh();
      else if (p === 1) style = { ...style, b: true };
      else if (p === 2) style = { ...style, d: true };
      else if (p === 3) style = { ...style, i: true };
      else if (p === 4) style = { ...style, u: true };
      else if (p === 7) style = { ...style, inv: true };
      else if (p === 9) style = { ...style, s: true };
      else if (p === 21 || p === 22) style = { ...style, b: false, d: false };
      else if (p === 23) style = { ...style, i: false };
      else if (p === 24) style = { ...style, u: false };
      else if (p === 27) style = { ...style, inv: false };
      else if (p === 29) style = { ...style, s: false };
      else if (p >= 30 && p <= 37) style = { ...style, fg: p - 30 };
      else if (p === 39) style = { ...style, fg: null };
      else if (p >= 40 && p <= 47) style = { ...style, bg: p - 40 };
      else if (p === 49) style = { ...style, bg: null };
      else if (p >= 90 && p <= 97) style = { ...style, fg: p - 90 + 8 };
      else if (p >= 100 && p <= 107) style = { ...style, bg: p - 100 + 8 };
      else if (p === 38 || p === 48) {
        const { value, used } = extended(params, k);
        style = p === 38 ? { ...style, fg: value } : { ...style, bg: value };
        k += used;
      }
    }
  }
  function put(ch: string): void {
    chars[col] = ch;
    styles[col] = style;
    col++;
  }

  const n = input.length;
  for (let i = 0; i < n;) {
    const code = input.charCodeAt(i);
    if (code === 0x1b) {
      const next = input[i + 1];
      if (next === "[") {
        // CSI: parameter bytes 0x30–0x3f, intermediates 0x20–0x2f, one final byte 0x40–0x7e.
        let j = i + 2;
        while (j < n && input.charCodeAt(j) >= 0x30 && input.charCodeAt(j) <= 0x3f) j++;
        const paramText = input.slice(i + 2, j);
        while (j < n && input.charCodeAt(j) >= 0x20 && input.charCodeAt(j) <= 0x2f) j++;
        const final = j < n ? input[j] : "";
        i = j < n ? j + 1 : n;
        if (final === "m" && /^[\d;:]*$/.test(paramText)) {
          sgr(paramText === "" ? [] : paramText.split(/[;:]/).map((x) => (x === "" ? 0 : Math.min(Number(x), 65535))));
        } else if (final === "K") {
          const mode = paramText === "" ? 0 : Number(paramText);
          if (mode === 0) {
            chars.length = Math.min(chars.length, col);
            styles.length = chars.length;
          } else if (mode === 2) {
            for (let c = 0; c < chars.length; c++) chars[c] = " ";
          }
        } else if (final === "G" || final === "`") {
          col = Math.max(0, Math.min((Number(paramText) || 1) - 1, 4096));
          while (chars.length < col) {
            chars.push(" ");
            styles.push(fresh());
          }
        }
        continue;
      }
      if (next === "]") {
        // OSC (titles, hyperlinks): up to BEL or ESC \.
        let j = i + 2;
        while (j < n && input.charCodeAt(j) !== 0x07 && !(input.charCodeAt(j) === 0x1b && input[j + 1] === "\\")) j++;
        i = j >= n ? n : input.charCodeAt(j) === 0x07 ? j + 1 : j + 2;
        continue;
      }
      // Any other escape (ESC ( B charsets, ESC 7 …): ESC, its intermediates 0x20–0x2f, one final byte.
      let j = i + 1;
      while (j < n && input.charCodeAt(j) >= 0x20 && input.charCodeAt(j) <= 0x2f) j++;
      i = Math.min(n, j + 1);
      continue;
    }
    if (code === 0x0d) {
      col = 0;
      i++;
      continue;
    }
    if (code === 0x08) {
      col = Math.max(0, col - 1);
      i++;
      continue;
    }
    if (code === 0x09) {
      // A tab: to the next multiple of 8, as terminals do.
      const to = (Math.floor(col / 8) + 1) * 8;
      while (col < to) put(" ");
      i++;
      continue;
    }
    if (code < 0x20 || code === 0x7f) {
      i++;
      continue;
    }
    // Whole code points: a surrogate pair is one cell.
    const wide =
      code >= 0xd800 &&
      code <= 0xdbff &&
      i + 1 < n &&
      input.charCodeAt(i + 1) >= 0xdc00 &&
      input.charCodeAt(i + 1) <= 0xdfff;
    put(wide ? input.slice(i, i + 2) : input[i]!);
    i += wide ? 2 : 1;
  }

  // Cells → runs of equal style.
  const runs: AnsiRun[] = [];
  let current: AnsiRun | null = null;
  let currentStyle: Style | null = null;
  for (let c = 0; c < chars.length; c++) {
    const s = styles[c] ?? fresh();
    if (currentStyle !== s || current === null) {
      const fgRaw = s.inv ? (s.bg ?? 0) : s.fg;
      const bgRaw = s.inv ? (s.fg ?? 7) : s.bg;
      const cls: string[] = [];
      if (s.b) cls.push("a-b");
      if (s.d) cls.push("a-d");
      if (s.i) cls.push("a-i");
      if (s.u) cls.push("a-u");
      if (s.s) cls.push("a-s");
      const run: AnsiRun = { text: "", cls: "" };
      if (typeof fgRaw === "number") cls.push(`a-f${fgRaw}`);
      else if (typeof fgRaw === "string") run.fg = fgRaw;
      if (typeof bgRaw === "number") cls.push(`a-g${bgRaw}`);
      else if (typeof bgRaw === "string") run.bg = bgRaw;
      run.cls = cls.join(" ");
      if (current && current.cls === run.cls && current.fg === run.fg && current.bg === run.bg) {
        currentStyle = s;
      } else {
        current = run;
        currentStyle = s;
        runs.push(run);
      }
    }
    current!.text += chars[c] ?? " ";
  }
  return runs;
}
