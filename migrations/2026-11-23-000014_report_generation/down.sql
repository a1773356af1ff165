DROP TABLE report_generation;
