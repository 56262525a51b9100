/**
 * console.js: the browser app as one script built from the source text of two
 * self-contained functions (no bundler at build or run time). `__name` is defined first
 * because some TypeScript transforms (keepNames) wrap functions in it.
 */
import { parseAnsiLine } from "./ansi.js";
import { consoleMain } from "./app.js";
import { createSectionFolds } from "./sections.js";

export const CONSOLE_JS = `"use strict";
var __name = function (f) { return f; };
(${consoleMain.toString()})(${parseAnsiLine.toString()}, ${createSectionFolds.toString()});
`;
