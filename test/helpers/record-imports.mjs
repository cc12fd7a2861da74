// `node --import` this with RECORD_IMPORTS=<file>: every module the process resolves is appended
// to the file, one URL per line (what a test checks a command does not load).
import { register } from 'node:module';

register(new URL('./record-imports-hooks.mjs', import.meta.url), { data: { file: process.env.RECORD_IMPORTS } });
