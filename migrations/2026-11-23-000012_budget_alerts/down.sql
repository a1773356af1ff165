DROP TABLE budget_alerts;
