/**
 * The console's stylesheet. Colours meet WCAG AA (4.5:1) against their backgrounds,
 * including the ANSI palette against the log's dark background (so "black" is a grey:
 * true black would be invisible there). Layout: one column, fluid to phone width; the
 * log scrolls sideways instead of wrapping, which keeps every line one row high (the
 * virtualised viewer needs that).
 */
import { SECTION_CSS } from "./sections.js";

export const CONSOLE_CSS = `
:root { --fg: #1b1f24; --muted: #4f5863; --bg: #ffffff; --line: #d0d7de; --accent: #0a58ca; --panel: #f6f8fa;
  --log-bg: #101418; --log-fg: #e6e6e6; --row: 20px; font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
* { box-sizing: border-box; }
[hidden] { display: none !important; }
body { margin: 0; color: var(--fg); background: var(--bg); line-height: 1.45; }
a { color: var(--accent); }
a:focus-visible, button:focus-visible, input:focus-visible, select:focus-visible, [tabindex]:focus-visible { outline: 3px solid #f0a000; outline-offset: 2px; }
.skip { position: absolute; left: -9999px; top: 0; background: #fff; padding: .5rem; z-index: 10; }
.skip:focus { left: .5rem; }
.top { background: #1b1f24; padding: .5rem 1rem; }
.top nav { display: flex; gap: 1rem; flex-wrap: wrap; align-items: center; }
.top a { color: #ffffff; text-decoration: none; font-weight: 600; }
.top a:hover { text-decoration: underline; }
.top .brand { margin-right: auto; }
main { max-width: 80rem; margin: 0 auto; padding: 1rem; }
h1 { font-size: 1.5rem; margin: .5rem 0 1rem; word-break: break-all; }
h2 { font-size: 1.2rem; margin: 1.5rem 0 .5rem; }
.muted { color: var(--muted); }
.yank-badge { display: inline-block; margin-left: .5rem; padding: 0 .4rem; border-radius: 4px; background: #fff4e5; color: #8a3b00; border: 1px solid #b35900; font-size: .85em; }
.yank-reason { color: #8a3b00; overflow-wrap: anywhere; }
tr.yanked .mono { text-decoration: line-through; }
.toolbar { display: flex; flex-wrap: wrap; gap: .5rem 1rem; align-items: center; margin: .5rem 0; }
button, .button { font: inherit; padding: .35rem .8rem; border: 1px solid #57606a; border-radius: 6px; background: var(--panel); color: var(--fg); cursor: pointer; text-decoration: none; display: inline-block; }
button.danger { background: #b42318; border-color: #8a1a12; color: #ffffff; }
button:disabled { opacity: .6; cursor: default; }
input, select { font: inherit; padding: .3rem .5rem; border: 1px solid #57606a; border-radius: 6px; background: #fff; color: var(--fg); }
label { font-weight: 600; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: .95rem; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--panel); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .9rem; }
dl.summary { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1rem; margin: 0 0 1rem; }
dl.summary dt { font-weight: 600; }
dl.summary dd { margin: 0; word-break: break-all; }
.badge { display: inline-block; padding: 0 .45rem; border-radius: 999px; font-size: .85rem; font-weight: 600; border: 1px solid currentColor; }
.s-open { color: #0a58ca; } .s-finished { color: #1a7f37; } .s-failed, .s-cancelled { color: #b42318; } .s-lost { color: #8a4600; }
.install { position: relative; background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: .5rem; margin: .5rem 0; display: flex; gap: .5rem; align-items: flex-start; }
.install pre { margin: 0; flex: 1; overflow-x: auto; white-space: pre; }
.status { min-height: 1.5em; }
.error { color: #b42318; font-weight: 600; }
.log-viewport { position: relative; height: 65vh; min-height: 16rem; overflow: auto; background: var(--log-bg); color: var(--log-fg); border-radius: 6px; }
.log-spacer { width: 1px; }
.log-rows { position: absolute; left: 0; top: 0; min-width: 100%; }
.row { height: var(--row); line-height: var(--row); white-space: pre; font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px; display: flex; }
.row .ln { flex: none; width: 5.5em; padding-right: .6em; text-align: right; color: #9aa4ae; text-decoration: none; user-select: none; }
.row .ln:hover, .row .ln:focus { color: #ffffff; text-decoration: underline; }
.row .ts { flex: none; width: 7.5em; padding-right: .6em; color: #9aa4ae; font-variant-numeric: tabular-nums; }
.row .ts.server { font-style: italic; }
.row .stream { flex: none; width: 2.4em; color: #ff9e96; font-size: 11px; }
.row .text { padding-right: 1em; }
.row.err { background: #2a1416; }
.row.marker .text { color: #f3d37a; font-style: italic; }
.row.marker { background: #2a2410; }
.row.target { background: #3a3f14; }
.row.pending .text { color: #9aa4ae; }
.visually-hidden { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; }
/* ANSI: bold, dim, italic, underline, strike; 16 colours tuned for 4.5:1 on the log background. */
.a-b { font-weight: 700; } .a-d { opacity: .8; } .a-i { font-style: italic; } .a-u { text-decoration: underline; } .a-s { text-decoration: line-through; }
.a-f0 { color: #9aa4ae; } .a-f1 { color: #ff7b72; } .a-f2 { color: #56d364; } .a-f3 { color: #e3b341; }
.a-f4 { color: #79c0ff; } .a-f5 { color: #d2a8ff; } .a-f6 { color: #56d4dd; } .a-f7 { color: #e6e6e6; }
.a-f8 { color: #b1bac4; } .a-f9 { color: #ffa198; } .a-f10 { color: #7ee787; } .a-f11 { color: #f2cc60; }
.a-f12 { color: #a5d6ff; } .a-f13 { color: #e2c5ff; } .a-f14 { color: #b3f0ff; } .a-f15 { color: #ffffff; }
.a-g0 { background: #000000; } .a-g1 { background: #8e1519; } .a-g2 { background: #0f5323; } .a-g3 { background: #6c4a00; }
.a-g4 { background: #0d419d; } .a-g5 { background: #6e2f9e; } .a-g6 { background: #0b5563; } .a-g7 { background: #6e7681; }
.a-g8 { background: #30363d; } .a-g9 { background: #b62324; } .a-g10 { background: #196c2e; } .a-g11 { background: #7d5a00; }
.a-g12 { background: #1158c7; } .a-g13 { background: #8e44c2; } .a-g14 { background: #0e6b7a; } .a-g15 { background: #8b949e; }
@media (max-width: 40rem) {
  main { padding: .5rem; }
  h1 { font-size: 1.2rem; }
  .row .ln { width: 4em; }
  th, td { padding: .3rem .4rem; }
  .hide-narrow { display: none; }
}
${SECTION_CSS}`;
