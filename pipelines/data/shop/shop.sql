-- The example source database of pipelines/shop.toml (a shop's orders).
-- Build it with:  sqlite3 pipelines/data/shop/shop.db < pipelines/data/shop/shop.sql
-- created_at holds UTC instants as SQLite's own datetime() text
-- ('YYYY-MM-DD HH:MM:SS'), the form tidemark binds a SQLite source's
-- period bounds in, so text comparison orders them as time.
CREATE TABLE orders (
  id         INTEGER PRIMARY KEY,
  customer   TEXT NOT NULL,
  total      NUMERIC NOT NULL,
  status     TEXT NOT NULL,
  created_at TEXT NOT NULL
);
CREATE INDEX orders_created_at ON orders (created_at, id);
INSERT INTO orders (id, customer, total, status, created_at) VALUES
  (1, 'customer-08', '22.31', 'shipped', '2024-01-01 00:00:00'),
  (2, 'customer-04', '39.62', 'refunded', '2024-01-01 07:26:00'),
  (3, 'customer-11', '56.93', 'paid', '2024-01-01 11:39:00'),
  (4, 'customer-07', '74.24', 'shipped', '2024-01-01 15:52:00'),
  (5, 'customer-03', '91.55', 'refunded', '2024-01-02 00:00:00'),
  (6, 'customer-10', '18.86', 'paid', '2024-01-02 07:18:00'),
  (7, 'customer-06', '36.17', 'shipped', '2024-01-02 11:31:00'),
  (8, 'customer-02', '53.48', 'refunded', '2024-01-02 15:44:00'),
  (9, 'customer-09', '70.79', 'paid', '2024-01-02 19:57:00'),
  (10, 'customer-05', '88.10', 'shipped', '2024-01-03 00:00:00'),
  (11, 'customer-01', '15.41', 'refunded', '2024-01-03 07:23:00'),
  (12, 'customer-08', '32.72', 'paid', '2024-01-03 11:36:00'),
  (13, 'customer-04', '50.03', 'shipped', '2024-01-04 00:00:00'),
  (14, 'customer-11', '67.34', 'refunded', '2024-01-04 07:02:00'),
  (15, 'customer-07', '84.65', 'paid', '2024-01-04 11:15:00'),
  (16, 'customer-03', '11.96', 'shipped', '2024-01-04 15:28:00'),
  (17, 'customer-10', '29.27', 'refunded', '2024-01-05 00:00:00'),
  (18, 'customer-06', '46.58', 'paid', '2024-01-05 07:54:00'),
  (19, 'customer-02', '63.89', 'shipped', '2024-01-05 11:07:00'),
  (20, 'customer-09', '81.20', 'refunded', '2024-01-05 15:20:00'),
  (21, 'customer-05', '8.51', 'paid', '2024-01-05 19:33:00'),
  (22, 'customer-01', '25.82', 'shipped', '2024-01-06 00:00:00'),
  (23, 'customer-08', '43.13', 'refunded', '2024-01-06 07:59:00'),
  (24, 'customer-04', '60.44', 'paid', '2024-01-06 11:12:00'),
  (25, 'customer-11', '77.75', 'shipped', '2024-01-07 00:00:00'),
  (26, 'customer-07', '5.06', 'refunded', '2024-01-07 07:38:00'),
  (27, 'customer-03', '22.37', 'paid', '2024-01-07 11:51:00'),
  (28, 'customer-10', '39.68', 'shipped', '2024-01-07 15:04:00');
