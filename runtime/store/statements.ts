// The store's SQLite file: the connection's settings, the tables, and the prepared statements.
import Database from 'better-sqlite3';

/** Opens the database file and creates the tables when missing (see README.md for the settings). */
export function openDatabase(file: string): Database.Database {
  const db = new Database(file);
  db.pragma('journal_mode = WAL');
  // NORMAL: a commit does not fsync the WAL on the event loop; the store does it with
  // fs.fsync before acknowledging (README.md), so an acknowledged write survives
  // kill -9 and power loss, and checkpoints keep syncing as FULL would.
  db.pragma('synchronous = NORMAL');
  // Checkpoints run in the worker (and here only when it falls behind).
  db.pragma('wal_autocheckpoint = 0');
  db.pragma('busy_timeout = 5000');
  // After a checkpoint the WAL is cut back to this size, so a burst does not keep its space.
  db.pragma('journal_size_limit = 8388608');
  db.exec(`
    CREATE TABLE IF NOT EXISTS objects (
      grp TEXT NOT NULL, resource TEXT NOT NULL, ns TEXT NOT NULL, name TEXT NOT NULL,
      rv INTEGER NOT NULL, data TEXT NOT NULL,
      PRIMARY KEY (grp, resource, ns, name)) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS events (
      rv INTEGER PRIMARY KEY, ts INTEGER NOT NULL, type TEXT NOT NULL,
      grp TEXT NOT NULL, resource TEXT NOT NULL, ns TEXT NOT NULL, name TEXT NOT NULL,
      data TEXT NOT NULL, prev TEXT);
    CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
    INSERT OR IGNORE INTO meta (key, value) VALUES ('rv', 0), ('compacted', 0);
  `);
  return db;
}

export function prepareStatements(db: Database.Database) {
  return {
    getMeta: db.prepare('SELECT value FROM meta WHERE key = ?'),
    setMeta: db.prepare('UPDATE meta SET value = ? WHERE key = ?'),
    insert: db.prepare('INSERT INTO objects (grp, resource, ns, name, rv, data) VALUES (?, ?, ?, ?, ?, ?)'),
    update: db.prepare('UPDATE objects SET rv = ?, data = ? WHERE grp = ? AND resource = ? AND ns = ? AND name = ?'),
    del: db.prepare('DELETE FROM objects WHERE grp = ? AND resource = ? AND ns = ? AND name = ?'),
    event: db.prepare(
      'INSERT INTO events (rv, ts, type, grp, resource, ns, name, data, prev) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)',
    ),
    loadAll: db.prepare('SELECT grp, resource, ns, name, data FROM objects'),
    maxEvent: db.prepare('SELECT max(rv) AS rv FROM events'),
    // Bounded by the durable rv: rows of a commit waiting for its fsync are not acknowledged yet.
    eventsAfter: db.prepare('SELECT * FROM events WHERE rv > ? AND rv <= ? ORDER BY rv'),
    eventsOfResourceAfter: db.prepare(
      'SELECT type, ns, name, prev FROM events WHERE rv > ? AND rv <= ? AND grp = ? AND resource = ? ORDER BY rv DESC',
    ),
    eventCutByAge: db.prepare('SELECT max(rv) AS rv FROM events WHERE ts < ?'),
    deleteEvents: db.prepare('DELETE FROM events WHERE rv <= ?'),
    logBytes: db.prepare(
      'SELECT sum(length(CAST(data AS BLOB)) + coalesce(length(CAST(prev AS BLOB)), 0)) AS n FROM events',
    ),
    logBytesUpTo: db.prepare(
      'SELECT sum(length(CAST(data AS BLOB)) + coalesce(length(CAST(prev AS BLOB)), 0)) AS n FROM events WHERE rv <= ?',
    ),
    eventSizes: db.prepare(
      'SELECT rv, length(CAST(data AS BLOB)) + coalesce(length(CAST(prev AS BLOB)), 0) AS n FROM events WHERE rv > ? ORDER BY rv',
    ),
    nsInUse: db.prepare('SELECT grp, resource, name FROM objects WHERE ns = ?'),
  };
}

export type Statements = ReturnType<typeof prepareStatements>;
